//! selector-svc: owns accounts, credentials and health, and answers "which accounts, in which order" (issue 4; not built yet).
