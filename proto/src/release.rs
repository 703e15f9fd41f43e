//! The descriptor sets of released protos, kept in the repository as
//! `proto/releases/<tag>/poolgate.binpb` (see `proto/releases/README.md`): how one is made from
//! the current protos, written at release time, and found again (the newest release is what
//! [`crate::compat`] checks new protos against).
//!
//! The functions take the releases directory as an argument; the crate's own tests and its
//! `release_descriptor` example pass `proto/releases` of the source tree.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use prost::Message;
use prost_types::FileDescriptorSet;

/// The name of a release's descriptor set inside its directory.
pub const DESCRIPTOR_FILE_NAME: &str = "poolgate.binpb";

/// What can go wrong reading or writing a release.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not an encoded FileDescriptorSet: {source}")]
    Decode {
        path: PathBuf,
        source: prost::DecodeError,
    },
    #[error("the current protos' descriptor set does not decode: {0}")]
    CurrentDecode(prost::DecodeError),
    #[error("release name {0:?} is not vMAJOR.MINOR.PATCH (e.g. v0.1.0)")]
    BadTag(String),
    #[error("{0} exists: a release's descriptor is not rewritten unless asked to (--force)")]
    Exists(PathBuf),
}

/// A release's name, `vMAJOR.MINOR.PATCH`; ordered as semver orders such versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReleaseTag {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl ReleaseTag {
    /// Reads `v1.2.3`. Anything else (a missing `v`, a pre-release suffix, a leading zero) is
    /// refused rather than guessed at, so a release directory is never silently skipped when the
    /// newest one is looked for.
    pub fn parse(tag: &str) -> Result<Self, ReleaseError> {
        let bad_tag = || ReleaseError::BadTag(tag.to_owned());
        let version = tag.strip_prefix('v').ok_or_else(bad_tag)?;
        let mut parts = version.split('.').map(|part| {
            let is_number = !part.is_empty()
                && part.bytes().all(|byte| byte.is_ascii_digit())
                && (part == "0" || !part.starts_with('0'));
            if is_number {
                part.parse::<u64>().map_err(|_| bad_tag())
            } else {
                Err(bad_tag())
            }
        });
        let (Some(major), Some(minor), Some(patch), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad_tag());
        };
        Ok(ReleaseTag {
            major: major?,
            minor: minor?,
            patch: patch?,
        })
    }
}

impl fmt::Display for ReleaseTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The current protos' descriptor set ([`crate::FILE_DESCRIPTOR_SET`]) as a release records it:
/// without `source_code_info`, so that editing a comment does not change the stored file.
pub fn current_descriptor_set() -> Result<FileDescriptorSet, ReleaseError> {
    let mut set = FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET)
        .map_err(ReleaseError::CurrentDecode)?;
    strip_source_code_info(&mut set);
    Ok(set)
}

/// Drops the comments and source positions of every file of the set.
pub fn strip_source_code_info(set: &mut FileDescriptorSet) {
    for file in &mut set.file {
        file.source_code_info = None;
    }
}

/// Where the release `tag`'s descriptor set is kept.
pub fn descriptor_path(releases_dir: &Path, tag: ReleaseTag) -> PathBuf {
    releases_dir
        .join(tag.to_string())
        .join(DESCRIPTOR_FILE_NAME)
}

/// Every release directory under `releases_dir`, oldest first; none when the directory does not
/// exist. Files there (the README) are not releases; a directory whose name is not a release tag
/// is an error.
pub fn releases(releases_dir: &Path) -> Result<Vec<ReleaseTag>, ReleaseError> {
    let io_error = |source| ReleaseError::Io {
        path: releases_dir.to_owned(),
        source,
    };
    let entries = match fs::read_dir(releases_dir) {
        Ok(entries) => entries,
        // No directory yet: nothing was released (the first release creates it).
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(io_error(error)),
    };
    let mut tags = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error)?;
        if !entry.file_type().map_err(io_error)?.is_dir() {
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        tags.push(ReleaseTag::parse(&name)?);
    }
    tags.sort();
    Ok(tags)
}

/// The newest release under `releases_dir`, if there is one.
pub fn newest_release(releases_dir: &Path) -> Result<Option<ReleaseTag>, ReleaseError> {
    Ok(releases(releases_dir)?.pop())
}

/// Reads the release `tag`'s descriptor set.
pub fn read_release(
    releases_dir: &Path,
    tag: ReleaseTag,
) -> Result<FileDescriptorSet, ReleaseError> {
    let path = descriptor_path(releases_dir, tag);
    let bytes = fs::read(&path).map_err(|source| ReleaseError::Io {
        path: path.clone(),
        source,
    })?;
    FileDescriptorSet::decode(bytes.as_slice())
        .map_err(|source| ReleaseError::Decode { path, source })
}

/// Writes `set` as the release `tag`'s descriptor set and returns its path. An existing release
/// is kept (`ReleaseError::Exists`) unless `overwrite`: a published release's record must not
/// drift.
pub fn write_release(
    releases_dir: &Path,
    tag: ReleaseTag,
    set: &FileDescriptorSet,
    overwrite: bool,
) -> Result<PathBuf, ReleaseError> {
    let path = descriptor_path(releases_dir, tag);
    if path.exists() && !overwrite {
        return Err(ReleaseError::Exists(path));
    }
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| ReleaseError::Io { path, source }
    };
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
    }
    fs::write(&path, set.encode_to_vec()).map_err(io_error(&path))?;
    Ok(path)
}
