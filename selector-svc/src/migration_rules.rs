//! The upgrade rules every migration in `migrations/` follows, checked over the files' text so a
//! test holds them without a database. Operators upgrade one service at a time while it serves,
//! so a selector of the previous release keeps running on the schema the new release migrated:
//! - from migration 0009 on, each migration inserts its own row into `schema_releases`: the
//!   oldest release that runs on the schema it produces. The minimum never falls from one
//!   migration to the next, and never passes the workspace's version (the release being built);
//! - additive first: a new `NOT NULL` column has a default, since an older release's inserts
//!   leave it out;
//! - removals a release later: a migration that drops, renames or retypes what an older release
//!   may read says so in a comment, `-- removes: <what>, unread since X.Y.Z`, where X.Y.Z is the
//!   first release that no longer reads it, an earlier release than the one being built; its
//!   row records a minimum of at least X.Y.Z.
//!
//! The statements are tokenized (comments dropped, literals kept apart, dollar-quoted bodies read
//! like the rest since a `DO` block runs them), not parsed: a removal is recognised by its
//! keywords, and a false alarm is answered with the comment.

use std::collections::HashSet;
use std::fmt;

use crate::release::Release;

/// The first migration that records its minimum (it creates `schema_releases`).
pub const FIRST_RECORDING_MIGRATION: i64 = 9;

/// One migration file: its number (the file name's prefix) and its SQL.
#[derive(Debug, Clone, Copy)]
pub struct MigrationText<'a> {
    pub number: i64,
    pub text: &'a str,
}

/// The rules, one per way a migration can break a rolling upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// From 0009 on, a migration inserts exactly its own row into `schema_releases`, with an
    /// `X.Y.Z` release, and changes no other row.
    RecordsItsMinimum,
    /// The minimum never decreases from one migration to the next.
    MinimumNeverFalls,
    /// The minimum is never a release after the workspace's version: this build runs on the
    /// schema it migrates to.
    MinimumNotPastThisRelease,
    /// A new `NOT NULL` column has a default.
    NewColumnsHaveDefaults,
    /// A removal carries a well-formed `-- removes: <what>, unread since X.Y.Z` comment.
    RemovalsAreAnnounced,
    /// A removal's migration records a minimum of at least its `unread since` release.
    RemovalRaisesTheMinimum,
    /// The `unread since` release is before the workspace's version: the removal ships at least
    /// a release after the last release that read it.
    RemovalsComeAReleaseLater,
}

/// A rule a migration breaks, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub migration: i64,
    pub rule: Rule,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "migration {:04} ({:?}): {}",
            self.migration, self.rule, self.detail
        )
    }
}

/// Every rule over every migration, in number order; `this_release` is the workspace's version.
pub fn check(migrations: &[MigrationText<'_>], this_release: Release) -> Vec<Violation> {
    let mut sorted = migrations.to_vec();
    sorted.sort_by_key(|migration| migration.number);
    let mut violations = Vec::new();
    let mut previous: Option<(i64, Release)> = None;
    for migration in sorted {
        let number = migration.number;
        let mut broken = |rule, detail: String| {
            violations.push(Violation {
                migration: number,
                rule,
                detail,
            })
        };
        let statements = statements(migration.text);

        let recorded = if number >= FIRST_RECORDING_MIGRATION {
            match recorded_minimum(number, &statements) {
                Ok(minimum) => Some(minimum),
                Err(detail) => {
                    broken(Rule::RecordsItsMinimum, detail);
                    None
                }
            }
        } else {
            None
        };
        if let Some(minimum) = recorded {
            if let Some((before, earlier)) = previous
                && minimum < earlier
            {
                broken(
                    Rule::MinimumNeverFalls,
                    format!(
                        "records oldest release {minimum}, below migration {before:04}'s {earlier}"
                    ),
                );
            }
            if minimum > this_release {
                broken(
                    Rule::MinimumNotPastThisRelease,
                    format!(
                        "records oldest release {minimum}, after this release ({this_release}): \
                         the release that ships it could not run on it"
                    ),
                );
            }
            previous = Some((number, minimum));
        }

        for column in new_columns_without_default(&statements) {
            broken(
                Rule::NewColumnsHaveDefaults,
                format!(
                    "adds column {column} NOT NULL without a default: an older release's \
                     inserts leave it out"
                ),
            );
        }

        let removals = removals(&statements);
        let (announced, malformed) = announcements(migration.text);
        for line in malformed {
            broken(
                Rule::RemovalsAreAnnounced,
                format!("`{line}` is not `-- removes: <what>, unread since X.Y.Z`"),
            );
        }
        if !removals.is_empty() && announced.is_empty() {
            broken(
                Rule::RemovalsAreAnnounced,
                format!(
                    "{} without a `-- removes: <what>, unread since X.Y.Z` comment naming the \
                     first release that no longer reads it",
                    removals.join(", ")
                ),
            );
        }
        for removal in &announced {
            let since = removal.unread_since;
            match recorded {
                Some(minimum) if minimum >= since => {}
                Some(minimum) => broken(
                    Rule::RemovalRaisesTheMinimum,
                    format!(
                        "removes {}, unread since {since}, but records oldest release {minimum}: \
                         a release before {since} still reads it",
                        removal.what
                    ),
                ),
                None => broken(
                    Rule::RemovalRaisesTheMinimum,
                    format!(
                        "removes {}, unread since {since}, but records no oldest release",
                        removal.what
                    ),
                ),
            }
            if since >= this_release {
                broken(
                    Rule::RemovalsComeAReleaseLater,
                    format!(
                        "removes {}, unread since {since}, in release {this_release}: the \
                         release that stops reading it must ship before the one that removes it",
                        removal.what
                    ),
                );
            }
        }
    }
    violations
}

/// One lexical token of a migration; comments are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A keyword, an unquoted name (folded to lower case, as Postgres folds it) or a number.
    Word(String),
    /// A double-quoted name, as written.
    Quoted(String),
    /// A string literal's content.
    Text(String),
    Punct(char),
}

impl Token {
    fn is(&self, word: &str) -> bool {
        matches!(self, Token::Word(w) if w == word)
    }

    /// A name as Postgres resolves it (folded unless quoted).
    fn name(&self) -> Option<&str> {
        match self {
            Token::Word(name) | Token::Quoted(name) => Some(name),
            _ => None,
        }
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Word(word) => f.write_str(word),
            Token::Quoted(name) => write!(f, "\"{name}\""),
            Token::Text(text) => write!(f, "'{text}'"),
            Token::Punct(c) => write!(f, "{c}"),
        }
    }
}

/// The migration's statements as tokens, split on `;`.
fn statements(sql: &str) -> Vec<Vec<Token>> {
    tokens(sql)
        .split(|token| *token == Token::Punct(';'))
        .filter(|statement| !statement.is_empty())
        .map(<[Token]>::to_vec)
        .collect()
}

fn tokens(sql: &str) -> Vec<Token> {
    let chars: Vec<char> = sql.chars().collect();
    let at = |i: usize| chars.get(i).copied();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(c) = at(i) {
        match c {
            c if c.is_whitespace() => i += 1,
            '-' if at(i + 1) == Some('-') => {
                while at(i).is_some_and(|c| c != '\n') {
                    i += 1;
                }
            }
            '/' if at(i + 1) == Some('*') => {
                // Postgres nests block comments.
                let mut depth = 0usize;
                loop {
                    match (at(i), at(i + 1)) {
                        (Some('/'), Some('*')) => (depth, i) = (depth + 1, i + 2),
                        (Some('*'), Some('/')) => (depth, i) = (depth - 1, i + 2),
                        (Some(_), _) => i += 1,
                        (None, _) => break,
                    }
                    if depth == 0 {
                        break;
                    }
                }
            }
            '\'' | '"' => {
                let mut content = String::new();
                i += 1;
                while let Some(d) = at(i) {
                    i += 1;
                    if d != c {
                        content.push(d);
                    } else if at(i) == Some(c) {
                        // A doubled quote is the quote itself.
                        content.push(c);
                        i += 1;
                    } else {
                        break;
                    }
                }
                tokens.push(if c == '"' {
                    Token::Quoted(content)
                } else {
                    Token::Text(content)
                });
            }
            '$' => {
                // `$$` or `$tag$` opens or closes a dollar-quoted body, which is read like the
                // statements around it: a `DO` block runs what it holds.
                let mut end = i + 1;
                while at(end).is_some_and(|d| d.is_alphanumeric() || d == '_') {
                    end += 1;
                }
                if at(end) == Some('$') {
                    i = end + 1;
                } else {
                    tokens.push(Token::Punct('$'));
                    i += 1;
                }
            }
            c if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while at(i).is_some_and(|d| d.is_alphanumeric() || d == '_' || d == '$') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                tokens.push(Token::Word(word.to_lowercase()));
            }
            other => {
                tokens.push(Token::Punct(other));
                i += 1;
            }
        }
    }
    tokens
}

/// The first `count` tokens from `start`, up to a comma, for a message.
fn describe(statement: &[Token], start: usize, count: usize) -> String {
    statement[start..]
        .iter()
        .take(count)
        .take_while(|token| **token != Token::Punct(','))
        .map(Token::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The oldest release the migration records: exactly one row, its own, of `schema_releases`.
fn recorded_minimum(number: i64, statements: &[Vec<Token>]) -> Result<Release, String> {
    let mut rows = Vec::new();
    for statement in statements {
        if let Some(after_table) = insert_into_schema_releases(statement) {
            rows.extend(inserted_rows(&statement[after_table..]).ok_or_else(|| {
                format!(
                    "its `{}` is not a plain `INSERT INTO schema_releases (migration, \
                     oldest_release) VALUES ({number}, 'X.Y.Z')`",
                    describe(statement, 0, 6)
                )
            })?);
        } else if statement.iter().any(|token| token.is("schema_releases"))
            && ["update", "delete", "truncate", "alter", "drop", "insert"]
                .iter()
                .any(|verb| statement[0].is(verb))
        {
            return Err(format!(
                "`{}` changes schema_releases other than by inserting its own row",
                describe(statement, 0, 4)
            ));
        }
    }
    match rows.as_slice() {
        [] => Err(format!(
            "inserts no row into schema_releases: add `INSERT INTO schema_releases (migration, \
             oldest_release) VALUES ({number}, 'X.Y.Z')` with the oldest release that runs on \
             the schema it produces"
        )),
        [(migration, _)] if *migration != number => Err(format!(
            "inserts the row of migration {migration} into schema_releases, not its own ({number})"
        )),
        [(_, oldest)] => Release::parse(oldest)
            .ok_or_else(|| format!("records oldest release {oldest:?}, not an X.Y.Z release")),
        _ => Err(format!(
            "inserts {} rows into schema_releases: exactly its own",
            rows.len()
        )),
    }
}

/// Where the table name of `INSERT INTO [schema.]schema_releases` ends, if the statement is one.
fn insert_into_schema_releases(statement: &[Token]) -> Option<usize> {
    if !(statement.first()?.is("insert") && statement.get(1)?.is("into")) {
        return None;
    }
    let qualified = statement.get(3) == Some(&Token::Punct('.'));
    let table = if qualified { 4 } else { 2 };
    (statement.get(table)?.name()? == "schema_releases").then_some(table + 1)
}

/// `[(migration, oldest_release)] VALUES (n, 'x'), …` and nothing after: the rows, or `None`.
fn inserted_rows(tokens: &[Token]) -> Option<Vec<(i64, String)>> {
    let mut rest = tokens;
    let mut columns = vec!["migration".to_owned(), "oldest_release".to_owned()];
    if rest.first() == Some(&Token::Punct('(')) {
        columns.clear();
        rest = &rest[1..];
        loop {
            let (name, after) = rest.split_first()?;
            columns.push(name.name()?.to_owned());
            match after.split_first()? {
                (Token::Punct(','), more) => rest = more,
                (Token::Punct(')'), more) => {
                    rest = more;
                    break;
                }
                _ => return None,
            }
        }
    }
    let migration_at = columns.iter().position(|c| c == "migration")?;
    let oldest_at = columns.iter().position(|c| c == "oldest_release")?;
    if columns.len() != 2 || !rest.first()?.is("values") {
        return None;
    }
    rest = &rest[1..];
    let mut rows = Vec::new();
    loop {
        let [open, first, comma, second, close, more @ ..] = rest else {
            return None;
        };
        if *open != Token::Punct('(') || *comma != Token::Punct(',') || *close != Token::Punct(')')
        {
            return None;
        }
        let values = [first, second];
        let Token::Word(number) = values[migration_at] else {
            return None;
        };
        let Token::Text(oldest) = values[oldest_at] else {
            return None;
        };
        rows.push((number.parse().ok()?, oldest.clone()));
        match more.split_first() {
            None => return Some(rows),
            Some((Token::Punct(','), next)) => rest = next,
            Some(_) => return None,
        }
    }
}

/// Words after `ADD` that start a table constraint or a type's value, not a column.
const NOT_A_COLUMN: [&str; 8] = [
    "constraint",
    "primary",
    "unique",
    "check",
    "foreign",
    "exclude",
    "value",
    "attribute",
];

/// Each `ADD [COLUMN] [IF NOT EXISTS] name …` clause: the column's name and its definition, up to
/// the comma that ends it.
fn added_columns(statement: &[Token]) -> Vec<(String, &[Token])> {
    let mut columns = Vec::new();
    for (at, token) in statement.iter().enumerate() {
        if !token.is("add") {
            continue;
        }
        let mut name_at = at + 1;
        if statement.get(name_at).is_some_and(|t| t.is("column")) {
            name_at += 1;
        }
        if statement.get(name_at).is_some_and(|t| t.is("if")) {
            name_at += 3;
        }
        let Some(name_token) = statement.get(name_at) else {
            continue;
        };
        let Some(name) = name_token.name() else {
            continue;
        };
        if matches!(name_token, Token::Word(word) if NOT_A_COLUMN.contains(&word.as_str())) {
            continue;
        }
        let mut depth = 0i32;
        let mut end = name_at + 1;
        while let Some(token) = statement.get(end) {
            match token {
                Token::Punct('(') => depth += 1,
                Token::Punct(')') => depth -= 1,
                Token::Punct(',') if depth == 0 => break,
                _ => {}
            }
            end += 1;
        }
        columns.push((name.to_owned(), &statement[name_at + 1..end]));
    }
    columns
}

/// New columns declared `NOT NULL` with nothing to fill them when a row is inserted without them.
fn new_columns_without_default(statements: &[Vec<Token>]) -> Vec<String> {
    let filled = ["default", "generated", "serial", "bigserial", "smallserial"];
    statements
        .iter()
        .flat_map(|statement| added_columns(statement))
        .filter(|(_, definition)| {
            let not_null = definition
                .windows(2)
                .any(|pair| pair[0].is("not") && pair[1].is("null"));
            let is_filled = definition
                .iter()
                .any(|token| filled.iter().any(|word| token.is(word)));
            not_null && !is_filled
        })
        .map(|(name, _)| name)
        .collect()
}

/// What the migration removes or changes that an older release may read or write: every `DROP`
/// (a table, column, type, view, function, index, default, `NOT NULL`, …) except a constraint
/// dropped and added again under its name in the same migration (widening a check), every
/// `RENAME`, a column's new type, `SET NOT NULL` on a column the migration did not add, and
/// `TRUNCATE`.
fn removals(statements: &[Vec<Token>]) -> Vec<String> {
    let added_columns: HashSet<String> = statements
        .iter()
        .flat_map(|statement| added_columns(statement))
        .map(|(name, _)| name)
        .collect();
    let added_constraints: HashSet<&str> = statements
        .iter()
        .flat_map(|statement| {
            statement.windows(3).filter_map(|window| {
                let named = window[1].is("constraint") && !window[0].is("drop");
                named.then(|| window[2].name()).flatten()
            })
        })
        .collect();
    let mut removals = Vec::new();
    for statement in statements {
        let token = |at: usize| statement.get(at);
        for (at, current) in statement.iter().enumerate() {
            if current.is("drop") {
                if token(at + 1).is_some_and(|t| t.is("constraint")) {
                    let mut name_at = at + 2;
                    if token(name_at).is_some_and(|t| t.is("if")) {
                        name_at += 2;
                    }
                    let name = token(name_at).and_then(Token::name);
                    if name.is_some_and(|name| added_constraints.contains(name)) {
                        continue;
                    }
                }
                removals.push(describe(statement, at, 4));
            } else if current.is("rename") || (at == 0 && current.is("truncate")) {
                removals.push(describe(statement, at, 4));
            } else if current.is("alter") {
                let mut name_at = at + 1;
                if token(name_at).is_some_and(|t| t.is("column")) {
                    name_at += 1;
                }
                let Some(name) = token(name_at).and_then(Token::name) else {
                    continue;
                };
                let next =
                    |offset: usize, word: &str| token(name_at + offset).is_some_and(|t| t.is(word));
                let new_type =
                    next(1, "type") || (next(1, "set") && next(2, "data") && next(3, "type"));
                let tightened = next(1, "set") && next(2, "not") && next(3, "null");
                if new_type || (tightened && !added_columns.contains(name)) {
                    removals.push(describe(statement, at, name_at - at + 4));
                }
            }
        }
    }
    removals
}

/// A `-- removes: <what>, unread since X.Y.Z` comment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Announcement {
    what: String,
    unread_since: Release,
}

/// The migration's `-- removes:` comments, and the lines among them that do not read.
fn announcements(sql: &str) -> (Vec<Announcement>, Vec<String>) {
    let mut announced = Vec::new();
    let mut malformed = Vec::new();
    for line in sql.lines().map(str::trim) {
        let Some(comment) = line.strip_prefix("--") else {
            continue;
        };
        let Some(body) = comment.trim_start().strip_prefix("removes:") else {
            continue;
        };
        let parsed = body
            .rsplit_once(", unread since ")
            .and_then(|(what, since)| {
                let what = what.trim();
                let unread_since = Release::parse(since.trim())?;
                (!what.is_empty()).then(|| Announcement {
                    what: what.to_owned(),
                    unread_since,
                })
            });
        match parsed {
            Some(announcement) => announced.push(announcement),
            None => malformed.push(line.to_owned()),
        }
    }
    (announced, malformed)
}

#[cfg(test)]
mod tests;
