//! Rebuilds the selector when a file in `migrations/` is added or changes: `sqlx::migrate!`
//! embeds the directory, but cargo only sees the Rust sources, so a new migration would otherwise
//! be left out of the build until one of them changed.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
