//! Secrets a binary takes from its flags: from a file (`--…-file`, which keeps them out of
//! `/proc/<pid>/cmdline` and shell history) or, still accepted with a warning, on the command
//! line itself. The environment variable of a flag stays a quiet alternative: a process's
//! environment is readable by its own user only.

use std::path::Path;

/// One secret flag as parsed: its direct value, where that came from, and its file flag.
#[derive(Debug, Clone, Copy)]
pub struct SecretFlag<'a> {
    /// The flag's name, `--admin-token`; its file flag is the same name with `-file`.
    pub flag: &'a str,
    /// The value given directly, by the flag or its environment variable.
    pub value: Option<&'a str>,
    /// `value` came from the command line (visible to every user of the machine).
    pub on_command_line: bool,
    /// The path given to the file flag.
    pub file: Option<&'a Path>,
}

impl SecretFlag<'_> {
    /// The secret, or `None` when neither the flag nor its file was given. Both given is an
    /// error (which one wins would be a guess); a value on the command line logs a warning.
    pub fn resolve(&self) -> Result<Option<String>, String> {
        if self.warning().is_some() {
            tracing::warn!(
                flag = %self.flag,
                instead = %self.file_flag(),
                "a secret on the command line is visible in /proc/<pid>/cmdline"
            );
        }
        self.read()
    }

    /// As [`SecretFlag::resolve`], without logging (for a CLI that prints its own warnings).
    pub fn read(&self) -> Result<Option<String>, String> {
        let file_flag = self.file_flag();
        match (self.value, self.file) {
            (Some(_), Some(_)) => Err(format!(
                "{} and {file_flag} both given: pass the secret one way only",
                self.flag
            )),
            (None, Some(path)) => read_secret_file(&file_flag, path).map(Some),
            (Some(value), None) => Ok(Some(value.to_owned())),
            (None, None) => Ok(None),
        }
    }

    /// The warning a secret given on the command line deserves, if it was.
    pub fn warning(&self) -> Option<String> {
        (self.on_command_line && self.value.is_some() && self.file.is_none()).then(|| {
            format!(
                "{} is visible in /proc/<pid>/cmdline; use {}",
                self.flag,
                self.file_flag()
            )
        })
    }

    fn file_flag(&self) -> String {
        format!("{}-file", self.flag)
    }
}

/// A secret file's content without its trailing newline (editors and `echo` add one). An empty
/// file is an error: an empty secret is a mistake, never a way to turn a check off.
pub fn read_secret_file(file_flag: &str, path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{file_flag} {}: {e}", path.display()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.trim().is_empty() {
        return Err(format!("{file_flag} {} is empty", path.display()));
    }
    Ok(secret.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag<'a>(
        value: Option<&'a str>,
        on_command_line: bool,
        file: Option<&'a Path>,
    ) -> SecretFlag<'a> {
        SecretFlag {
            flag: "--admin-token",
            value,
            on_command_line,
            file,
        }
    }

    #[test]
    fn a_secret_file_loses_its_trailing_newline_only() {
        let dir = std::env::temp_dir().join(format!("secret-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("token");
        std::fs::write(&path, "  s3cret token\r\n").expect("write");
        assert_eq!(
            flag(None, false, Some(&path)).read(),
            Ok(Some("  s3cret token".to_owned()))
        );
        std::fs::write(&path, "\n").expect("write");
        let error = flag(None, false, Some(&path)).read().expect_err("empty");
        assert!(
            error.contains("--admin-token-file") && error.contains("empty"),
            "{error}"
        );
        let missing = dir.join("missing");
        let error = flag(None, false, Some(&missing))
            .read()
            .expect_err("missing");
        assert!(error.starts_with("--admin-token-file"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn both_ways_at_once_is_an_error_and_only_the_command_line_warns() {
        let path = Path::new("/nonexistent");
        let error = flag(Some("x"), true, Some(path)).read().expect_err("both");
        assert!(
            error.contains("--admin-token and --admin-token-file"),
            "{error}"
        );
        assert_eq!(flag(Some("x"), false, None).read(), Ok(Some("x".into())));
        assert_eq!(flag(Some("x"), false, None).warning(), None);
        let warning = flag(Some("x"), true, None).warning().expect("warns");
        assert!(
            warning.contains("/proc/<pid>/cmdline") && warning.contains("--admin-token-file"),
            "{warning}"
        );
        assert_eq!(flag(None, false, None).read(), Ok(None));
    }
}
