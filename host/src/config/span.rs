//! Config errors that point into the text: `file:line:col`, the offending
//! line and a caret under the value, rendered like rustc and cargo do.
//!
//! The renderer is hand-written on purpose: `toml` already hands over byte
//! spans, and turning one span into a line, a column and a caret is the few
//! lines of [`locate`]; a snippet-rendering crate would add a dependency and
//! its own output format for no gain in what the error says.

use std::{fmt, ops::Range};

/// A config error pointing into the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// File name or origin.
    pub origin: String,
    /// 1-based line, 0 when unknown.
    pub line: usize,
    /// 1-based column, 0 when unknown.
    pub col: usize,
    /// What was wrong and what was expected.
    pub message: String,
    /// The offending source line.
    pub source_line: String,
    /// Caret width.
    pub width: usize,
    /// An example of a valid value.
    pub help: Option<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if self.line == 0 {
            write!(f, "\n  --> {}", self.origin)?;
        } else {
            let num = self.line.to_string();
            let pad = " ".repeat(num.len());
            write!(
                f,
                "\n{pad}--> {}:{}:{}\n{pad} |\n{num} | {}\n{pad} | {}{}",
                self.origin,
                self.line,
                self.col,
                self.source_line,
                " ".repeat(self.col.saturating_sub(1)),
                "^".repeat(self.width.max(1))
            )?;
        }
        if let Some(help) = &self.help {
            write!(
                f,
                "\n{} = help: {help}",
                " ".repeat(self.line.to_string().len())
            )?;
        }
        Ok(())
    }
}

/// Where the keys of one plugin's `[plugin.config]` table were written, so
/// that the plugin's refusal of a key (its message names
/// `plugin.<name>.config.<key>`) points at `file:line:col` like the host's
/// own config errors. Never part of a spec's equality: the same table on
/// other lines is the same setting (a reload keeps the instance).
#[derive(Debug, Clone, Default)]
pub struct KeyPlaces {
    origin: String,
    /// The table itself (its header, or the plugin's name without one).
    table: Option<Location>,
    /// Each top-level key of the table.
    keys: Vec<(String, Location)>,
}

impl PartialEq for KeyPlaces {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for KeyPlaces {}

impl KeyPlaces {
    /// Records the places of a table in `text` (`table`: the span that
    /// stands for the table, `keys`: each key's span).
    pub(super) fn new(
        text: &str,
        origin: String,
        table: Option<Range<usize>>,
        keys: impl IntoIterator<Item = (String, Range<usize>)>,
    ) -> KeyPlaces {
        KeyPlaces {
            origin,
            table: table.map(|s| locate(text, s)),
            keys: keys
                .into_iter()
                .map(|(k, s)| (k, locate(text, s)))
                .collect(),
        }
    }

    /// `message` (a plugin's config error) as a [`ConfigError`] at the key
    /// it names: the first `` `plugin.<instance>.config.<key>` `` in it, or
    /// the table when it names none that was written.
    pub fn error(&self, instance: &str, message: String) -> ConfigError {
        let prefix = format!("`plugin.{instance}.config.");
        let key = message.find(&prefix).and_then(|i| {
            let rest = &message[i + prefix.len()..];
            let end = rest.find(['`', '.']).unwrap_or(rest.len());
            Some(&rest[..end]).filter(|k| !k.is_empty())
        });
        let at = key
            .and_then(|k| self.keys.iter().find(|(name, _)| name == k))
            .map(|(_, at)| at)
            .or(self.table.as_ref());
        ConfigError {
            origin: self.origin.clone(),
            line: at.map_or(0, |a| a.line),
            col: at.map_or(0, |a| a.col),
            source_line: at.map_or_else(String::new, |a| a.source_line.clone()),
            width: at.map_or(0, |a| a.width),
            message,
            help: None,
        }
    }
}

/// Where a byte span falls in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    /// The span's first line, without its line break.
    pub source_line: String,
    /// Characters of the span on that line (the caret's width).
    pub width: usize,
}

/// Locates `span` (clamped to the text) in `text`.
pub(super) fn locate(text: &str, span: Range<usize>) -> Location {
    let start = floor_char_boundary(text, span.start);
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let end = floor_char_boundary(text, span.end.min(line_end).max(start));
    Location {
        line,
        col: text[line_start..start].chars().count() + 1,
        source_line: text[line_start..line_end].trim_end().to_owned(),
        width: text[start..end].chars().count(),
    }
}

/// The largest char boundary of `text` at or below `i`.
fn floor_char_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_a_span_on_its_line() {
        let text = "[fetch]\nmode = \"fast\"\n";
        let at = locate(text, 15..21);
        assert_eq!(
            at,
            Location {
                line: 2,
                col: 8,
                source_line: "mode = \"fast\"".to_owned(),
                width: 6
            }
        );
    }

    #[test]
    fn columns_count_characters_and_spans_stop_at_the_line_end() {
        let text = "name = \"é\" # ü\nnext = 1\n";
        let at = locate(text, 7..text.len());
        assert_eq!((at.line, at.col, at.width), (1, 8, 7));
        assert_eq!(at.source_line, "name = \"é\" # ü");
        // A span past the end, or inside a multi-byte character, is clamped.
        let end = locate(text, 100..200);
        assert_eq!((end.line, end.col, end.width), (3, 1, 0));
        assert_eq!(locate(text, 9..10).col, 9);
    }

    #[test]
    fn renders_file_line_col_caret_and_help() {
        let e = ConfigError {
            origin: "node.toml".into(),
            line: 12,
            col: 3,
            message: "`x`: expected 1".into(),
            source_line: "x = 2".into(),
            width: 1,
            help: Some("example: x = 1".into()),
        };
        assert_eq!(
            e.to_string(),
            "`x`: expected 1\n  --> node.toml:12:3\n   |\n12 | x = 2\n   |   ^\n   = help: example: x = 1"
        );
        let e = ConfigError {
            line: 0,
            col: 0,
            help: None,
            ..e
        };
        assert_eq!(e.to_string(), "`x`: expected 1\n  --> node.toml");
    }
}
