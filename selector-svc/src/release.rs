//! Release numbers: `X.Y.Z` as the schema records the oldest release that runs on it
//! (`schema_releases.oldest_release`, migration 0009), and this build's version, compared as
//! semver orders them. A few lines instead of a dependency: the schema only ever holds plain
//! `X.Y.Z`, so the one semver rule beyond numeric order that matters is that a pre-release of
//! this build (`0.2.0-rc.1`) ranks below its release.

use std::fmt;

/// A release as the schema records it: `major.minor.patch`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl Release {
    /// `X.Y.Z` exactly, each a semver number (digits, no leading zero but `0` itself): what
    /// migration 0009's check lets into `schema_releases`. Anything else is `None`.
    pub fn parse(text: &str) -> Option<Release> {
        let mut parts = text.split('.');
        let major = number(parts.next()?)?;
        let minor = number(parts.next()?)?;
        let patch = number(parts.next()?)?;
        if parts.next().is_some() {
            return None;
        }
        Some(Release {
            major,
            minor,
            patch,
        })
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// One numeric semver identifier.
fn number(text: &str) -> Option<u64> {
    let digits_only = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = text.len() > 1 && text.starts_with('0');
    if !digits_only || leading_zero {
        return None;
    }
    text.parse().ok()
}

/// A build's version: a release, perhaps as a pre-release of it (`0.2.0-rc.1`); build metadata
/// (`+…`) is ignored, as semver says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildVersion {
    pub release: Release,
    pub pre_release: bool,
}

impl BuildVersion {
    /// This build's version (the workspace's, `CARGO_PKG_VERSION`). `None` only if the version
    /// were not semver, which cargo does not allow; a unit test holds it.
    pub fn this_build() -> Option<BuildVersion> {
        BuildVersion::parse(env!("CARGO_PKG_VERSION"))
    }

    /// `X.Y.Z`, `X.Y.Z-pre`, `X.Y.Z+build` or `X.Y.Z-pre+build`.
    pub fn parse(text: &str) -> Option<BuildVersion> {
        let without_build = text.split_once('+').map_or(text, |(version, _)| version);
        let (core, pre) = match without_build.split_once('-') {
            Some((core, pre)) if !pre.is_empty() => (core, true),
            Some(_) => return None,
            None => (without_build, false),
        };
        Some(BuildVersion {
            release: Release::parse(core)?,
            pre_release: pre,
        })
    }

    /// Whether this version is `minimum` or later: a pre-release of `minimum` itself is not.
    pub fn meets(&self, minimum: Release) -> bool {
        if self.pre_release {
            self.release > minimum
        } else {
            self.release >= minimum
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(text: &str) -> Release {
        Release::parse(text).expect("a release")
    }

    #[test]
    fn a_release_is_three_semver_numbers_and_nothing_else() {
        assert_eq!(
            Release::parse("0.1.0"),
            Some(Release {
                major: 0,
                minor: 1,
                patch: 0
            })
        );
        assert_eq!(release("10.20.30").to_string(), "10.20.30");
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "v1.2.3",
            "1.2.x",
            "01.2.3",
            "1.02.3",
            "1.2.03",
            "1..3",
            "1.2.3-rc.1",
            " 1.2.3",
            "1.2.-3",
        ] {
            assert_eq!(Release::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn releases_order_numerically_not_as_text() {
        assert!(release("0.10.0") > release("0.9.0"));
        assert!(release("1.0.0") > release("0.99.99"));
        assert!(release("0.1.10") > release("0.1.9"));
        assert_eq!(release("0.1.0"), release("0.1.0"));
    }

    #[test]
    fn a_build_meets_its_own_release_and_older_ones_but_a_pre_release_does_not_meet_its_own() {
        let build = BuildVersion::parse("0.2.0").expect("version");
        assert!(build.meets(release("0.2.0")));
        assert!(build.meets(release("0.1.9")));
        assert!(!build.meets(release("0.2.1")));
        let rc = BuildVersion::parse("0.2.0-rc.1+abc").expect("version");
        assert!(rc.pre_release);
        assert!(!rc.meets(release("0.2.0")));
        assert!(rc.meets(release("0.1.0")));
        let with_build = BuildVersion::parse("0.2.0+abc").expect("version");
        assert!(!with_build.pre_release && with_build.meets(release("0.2.0")));
        for bad in ["0.2", "0.2.0-", "v0.2.0", "0.2.0.1-rc"] {
            assert_eq!(BuildVersion::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn this_build_has_a_semver_version() {
        let this = BuildVersion::this_build().expect("CARGO_PKG_VERSION is semver");
        assert!(env!("CARGO_PKG_VERSION").starts_with(&this.release.to_string()));
    }
}
