//! `import`: accounts from the credential files teams already have.

use crate::AdminEndpoint;

use super::VerbError;

#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct Import {
    /// The files to import.
    #[arg(required = true)]
    pub files: Vec<std::path::PathBuf>,
    /// Prints what would change (secrets masked) and changes nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The group of new accounts whose file names none (default: `default`).
    #[arg(long)]
    pub group: Option<String>,
}

pub async fn run(_endpoint: &dyn AdminEndpoint, _import: &Import) -> Result<String, VerbError> {
    Err(VerbError::Partial("import: not built yet".into()))
}
