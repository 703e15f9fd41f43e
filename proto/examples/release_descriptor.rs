//! Records the current protos' descriptor set as a release's, at release time:
//!
//! ```text
//! cargo run -p poolgate-proto --example release_descriptor -- v0.2.0 [--force]
//! ```
//!
//! writes `proto/releases/v0.2.0/poolgate.binpb` (comments stripped). An existing release is not
//! rewritten without `--force`. It also lists what breaks against the newest earlier release,
//! which the crate's compat test would fail on.

use std::path::Path;
use std::process::ExitCode;

use poolgate_proto::compat;
use poolgate_proto::release::{self, ReleaseTag};

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("release_descriptor: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let usage = "usage: release_descriptor vMAJOR.MINOR.PATCH [--force]";
    let mut tag = None;
    let mut force = false;
    for arg in args {
        match arg.as_str() {
            "--force" => force = true,
            "-h" | "--help" => {
                println!("{usage}");
                return Ok(());
            }
            _ if tag.is_none() => tag = Some(arg),
            _ => return Err(format!("unexpected argument {arg:?}; {usage}")),
        }
    }
    let tag = tag.ok_or(usage)?;
    let tag = ReleaseTag::parse(&tag).map_err(|error| error.to_string())?;
    let releases_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("releases");
    let current = release::current_descriptor_set().map_err(|error| error.to_string())?;

    let earlier = release::releases(&releases_dir)
        .map_err(|error| error.to_string())?
        .into_iter()
        .rfind(|release| *release < tag);
    if let Some(earlier) = earlier {
        let old =
            release::read_release(&releases_dir, earlier).map_err(|error| error.to_string())?;
        let changes = compat::breaking_changes(&old, &current);
        if changes.is_empty() {
            println!("no breaking change since {earlier}");
        } else {
            eprintln!("{} breaking changes since {earlier}:", changes.len());
            for change in &changes {
                eprintln!("  {change}");
            }
        }
    }

    let path = release::write_release(&releases_dir, tag, &current, force)
        .map_err(|error| error.to_string())?;
    println!("wrote {}", path.display());
    Ok(())
}
