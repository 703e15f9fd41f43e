//! The release is recorded in files, not only in a git tag (which may not travel with the
//! repository): the workspace version is the one every binary's `--version` prints, the Helm
//! chart's `appVersion`, a section of CHANGELOG.md, and a directory of `proto/releases/` holding
//! the release's descriptor set (CHANGELOG.md, "How a release is cut").

use crate::common;

use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn every_binary_prints_the_workspace_version() {
    for name in ["relay-svc", "selector-svc", "admission-svc"] {
        let output = std::process::Command::new(common::processes::binary(name))
            .arg("--version")
            .output()
            .expect("runs");
        assert!(output.status.success(), "{name} --version");
        let printed = String::from_utf8_lossy(&output.stdout);
        assert_eq!(printed.trim(), format!("{name} {VERSION}"), "{name}");
    }
}

#[test]
fn the_chart_the_changelog_and_the_proto_releases_record_the_version() {
    let chart = read("helm/poolgate/Chart.yaml");
    assert!(
        chart
            .lines()
            .any(|line| line.trim() == format!("appVersion: \"{VERSION}\"")),
        "Chart.yaml's appVersion is {VERSION}: {chart}"
    );
    let changelog = read("CHANGELOG.md");
    assert!(
        changelog.contains("## [Unreleased]"),
        "CHANGELOG.md keeps an Unreleased section on top"
    );
    let heading = format!("## [{VERSION}] - ");
    let dated = changelog
        .lines()
        .find_map(|line| line.strip_prefix(heading.as_str()))
        .unwrap_or_else(|| panic!("CHANGELOG.md has a dated section for {VERSION}"));
    let parts: Vec<&str> = dated.trim().split('-').collect();
    assert!(
        parts.len() == 3
            && [4, 2, 2]
                .iter()
                .zip(&parts)
                .all(|(len, part)| part.len() == *len && part.bytes().all(|b| b.is_ascii_digit())),
        "the release date is YYYY-MM-DD: {dated:?}"
    );
    let descriptor = repo()
        .join("proto/releases")
        .join(format!("v{VERSION}"))
        .join("poolgate.binpb");
    let bytes =
        std::fs::read(&descriptor).unwrap_or_else(|e| panic!("{}: {e}", descriptor.display()));
    assert!(!bytes.is_empty(), "the release's descriptor set is kept");
}
