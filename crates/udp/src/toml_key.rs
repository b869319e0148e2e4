//! Which key of a TOML file a byte offset falls in, so that an error the
//! TOML deserializer reports with a position ("invalid type: string, expected
//! usize" at line 4) can name the setting too (`bounce[0].max_sessions`).

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// The dotted path (`bounce[0].listen`, `hub.peer[1].public_key`) of the
/// innermost key or array element whose key or value spans byte `at` of
/// `text`; `None` when the text does not parse or `at` is outside every
/// key.
pub(crate) fn key_at(text: &str, at: usize) -> Option<String> {
    let doc = DeTable::parse(text).ok()?;
    let mut best = None;
    walk_table(doc.get_ref(), "", at, &mut best);
    best.map(|(_, path)| path)
}

/// The best match so far: the width of its span and its path.
type Best = Option<(usize, String)>;

fn consider(span: Range<usize>, at: usize, path: &str, best: &mut Best) {
    let width = span.end - span.start;
    if span.contains(&at) && best.as_ref().is_none_or(|(w, _)| width <= *w) {
        *best = Some((width, path.to_string()));
    }
}

fn walk_table(table: &DeTable<'_>, prefix: &str, at: usize, best: &mut Best) {
    for (k, v) in table.iter() {
        let path = format!("{prefix}{}", k.get_ref());
        consider(k.span(), at, &path, best);
        walk_value(v, &path, at, best);
    }
}

fn walk_value(v: &Spanned<DeValue<'_>>, path: &str, at: usize, best: &mut Best) {
    match v.get_ref() {
        DeValue::Table(t) => walk_table(t, &format!("{path}."), at, best),
        DeValue::Array(items) => {
            consider(v.span(), at, path, best);
            for (i, item) in items.iter().enumerate() {
                walk_value(item, &format!("{path}[{i}]"), at, best);
            }
        }
        _ => consider(v.span(), at, path, best),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str, needle: &str) -> Option<String> {
        key_at(text, text.find(needle).expect("in the text"))
    }

    #[test]
    fn names_keys_in_tables_and_arrays_of_tables() {
        let text = "workers = 2\n[[bounce]]\nlisten = [\":1\"]\n[[bounce]]\nlisten = \":2\"\nmax_sessions = \"x\"\n[hub]\nlisten = [\":3\", 4]\n";
        assert_eq!(at(text, "2\n").as_deref(), Some("workers"));
        assert_eq!(at(text, "\":2\"").as_deref(), Some("bounce[1].listen"));
        assert_eq!(at(text, "\"x\"").as_deref(), Some("bounce[1].max_sessions"));
        assert_eq!(at(text, "4]").as_deref(), Some("hub.listen[1]"));
        assert_eq!(at(text, "[hub]"), None);
    }
}
