//! The Prometheus text exposition format, written once for every service.
//!
//! A metric family is declared once, as a [`Family`]: its name, its help
//! text, whether it is a counter or a gauge, and the names of its labels.
//! An [`Exposition`] writes a family's `# HELP` and `# TYPE` lines, then
//! its samples through the [`Samples`] it returns, escaping help texts and
//! label values as the format requires (`\` → `\\`, newline → `\n`, and in
//! label values `"` → `\"`). A family or label name that the format does
//! not allow stops the build when the family is a `const` (a panic at run
//! time otherwise), so a typo never reaches a scraper.
//!
//! [`check`] reads a whole scrape back and reports what a scraper would
//! refuse (a family twice, a sample outside its family, a bad name): the
//! services' tests run it over their full pages.
//!
//! ```
//! use ferry_engine::stat::exposition::{Exposition, Family};
//!
//! const DROPS: Family = Family::counter("example_drops_total", "Datagrams dropped, by reason.")
//!     .labels(&["reason"]);
//!
//! let mut page = String::new();
//! let mut w = Exposition::new(&mut page);
//! w.family(&DROPS).sample(&["too_large"], 3u64).sample(&["queue_full"], 0u64);
//! assert_eq!(
//!     page,
//!     "# HELP example_drops_total Datagrams dropped, by reason.\n\
//!      ## TYPE example_drops_total counter\n\
//!      example_drops_total{reason=\"too_large\"} 3\n\
//!      example_drops_total{reason=\"queue_full\"} 0\n"
//! );
//! ```

use std::fmt::Write as _;

/// What a family's samples mean to Prometheus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (or restarts at zero); names end in `_total` by
    /// convention, though names derper chose without it are kept.
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Kind {
    /// The word on the `# TYPE` line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// One metric family, declared once: name, help text, kind and label
/// names.
#[derive(Clone, Copy, Debug)]
pub struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: Kind,
    labels: &'a [&'a str],
}

impl<'a> Family<'a> {
    /// A family of `kind` without labels.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`):
    /// at compile time for a `const`.
    pub const fn new(name: &'a str, help: &'a str, kind: Kind) -> Self {
        assert!(valid_name(name, true), "not a valid metric family name");
        Family {
            name,
            help,
            kind,
            labels: &[],
        }
    }

    /// A counter without labels.
    pub const fn counter(name: &'a str, help: &'a str) -> Self {
        Self::new(name, help, Kind::Counter)
    }

    /// A gauge without labels.
    pub const fn gauge(name: &'a str, help: &'a str) -> Self {
        Self::new(name, help, Kind::Gauge)
    }

    /// The same family with these label names, in the order samples give
    /// their values.
    ///
    /// # Panics
    ///
    /// If a name is not a valid label name (`[a-zA-Z_][a-zA-Z0-9_]*`, not
    /// starting with `__`, which Prometheus keeps for itself) or appears
    /// twice: at compile time for a `const`.
    pub const fn labels(self, labels: &'a [&'a str]) -> Self {
        let mut i = 0;
        while i < labels.len() {
            let l = labels[i].as_bytes();
            assert!(valid_name(labels[i], false), "not a valid label name");
            assert!(
                !(l.len() >= 2 && l[0] == b'_' && l[1] == b'_'),
                "label names starting with __ are reserved"
            );
            let mut j = 0;
            while j < i {
                assert!(!bytes_eq(labels[j].as_bytes(), l), "a label name twice");
                j += 1;
            }
            i += 1;
        }
        Family { labels, ..self }
    }

    /// The family's name.
    pub const fn name(&self) -> &'a str {
        self.name
    }

    /// Its help text (unescaped).
    pub const fn help(&self) -> &'a str {
        self.help
    }

    /// Counter or gauge.
    pub const fn kind(&self) -> Kind {
        self.kind
    }

    /// Its label names.
    pub const fn label_names(&self) -> &'a [&'a str] {
        self.labels
    }
}

/// Whether `s` is a metric name (`colon`) or a label name (not `colon`).
const fn valid_name(s: &str, colon: bool) -> bool {
    let b = s.as_bytes();
    if b.is_empty() {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let ok = c.is_ascii_alphabetic()
            || c == b'_'
            || (colon && c == b':')
            || (i > 0 && c.is_ascii_digit());
        if !ok {
            return false;
        }
        i += 1;
    }
    true
}

const fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A sample's value as the text format writes it.
pub trait Value {
    /// Appends the value to `out`.
    fn write_to(&self, out: &mut String);
}

macro_rules! integer_values {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn write_to(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_values!(u8, u16, u32, u64, usize, i32, i64);

impl Value for bool {
    /// 1 or 0.
    fn write_to(&self, out: &mut String) {
        out.push(if *self { '1' } else { '0' });
    }
}

impl Value for f64 {
    /// The shortest decimal that reads back as the same number; `NaN`,
    /// `+Inf` and `-Inf` as the format spells them.
    fn write_to(&self, out: &mut String) {
        if !float_special(*self, out) {
            let _ = write!(out, "{self}");
        }
    }
}

/// A float with a fixed number of decimals (`Fixed(1.5, 3)` is `1.500`):
/// for seconds and timestamps whose precision is part of how they read.
#[derive(Clone, Copy, Debug)]
pub struct Fixed(pub f64, pub usize);

impl Value for Fixed {
    fn write_to(&self, out: &mut String) {
        if !float_special(self.0, out) {
            let _ = write!(out, "{:.*}", self.1, self.0);
        }
    }
}

fn float_special(v: f64, out: &mut String) -> bool {
    let text = if v.is_nan() {
        "NaN"
    } else if v == f64::INFINITY {
        "+Inf"
    } else if v == f64::NEG_INFINITY {
        "-Inf"
    } else {
        return false;
    };
    out.push_str(text);
    true
}

/// Writes families into a page.
#[derive(Debug)]
pub struct Exposition<'o> {
    out: &'o mut String,
}

impl<'o> Exposition<'o> {
    /// Appends to `out` (which may already hold other families).
    pub fn new(out: &'o mut String) -> Self {
        Exposition { out }
    }

    /// Writes `family`'s `# HELP` and `# TYPE` lines; its samples follow
    /// through the returned [`Samples`]. A family with no samples is
    /// legal: its head alone says it exists.
    pub fn family<'w, 'f>(&'w mut self, family: &Family<'f>) -> Samples<'w, 'f> {
        let out = &mut *self.out;
        out.push_str("# HELP ");
        out.push_str(family.name);
        out.push(' ');
        escape_into(out, family.help, false);
        out.push_str("\n# TYPE ");
        out.push_str(family.name);
        out.push(' ');
        out.push_str(family.kind.as_str());
        out.push('\n');
        Samples {
            out,
            family: *family,
        }
    }

    /// A family without labels and its one sample.
    pub fn single(&mut self, family: &Family<'_>, value: impl Value) {
        self.family(family).value(value);
    }

    /// A counter without labels and its one sample.
    pub fn counter(&mut self, name: &str, help: &str, value: impl Value) {
        self.single(&Family::counter(name, help), value);
    }

    /// A gauge without labels and its one sample.
    pub fn gauge(&mut self, name: &str, help: &str, value: impl Value) {
        self.single(&Family::gauge(name, help), value);
    }
}

/// The samples of the family just written.
#[derive(Debug)]
pub struct Samples<'w, 'f> {
    out: &'w mut String,
    family: Family<'f>,
}

impl Samples<'_, '_> {
    /// The sample of a family without labels.
    pub fn value(&mut self, value: impl Value) -> &mut Self {
        self.sample(&[], value)
    }

    /// A sample with one value per label name, in the family's order.
    /// Values are escaped; giving more or fewer values than the family
    /// has labels is a bug (a debug assertion; a release build writes
    /// the pairs there are).
    pub fn sample(&mut self, values: &[&str], value: impl Value) -> &mut Self {
        debug_assert_eq!(
            values.len(),
            self.family.labels.len(),
            "{}: label values for {:?}",
            self.family.name,
            self.family.labels
        );
        let out = &mut *self.out;
        out.push_str(self.family.name);
        if !self.family.labels.is_empty() {
            out.push('{');
            for (i, (name, v)) in self.family.labels.iter().zip(values).enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(name);
                out.push_str("=\"");
                escape_into(out, v, true);
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        value.write_to(out);
        out.push('\n');
        self
    }
}

/// Appends `s` escaped: `\` and newline always, `"` in label values.
fn escape_into(out: &mut String, s: &str, quote: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// Reads a whole page back and lists what a scraper would refuse or
/// misread: a family declared twice, a sample whose name is not the
/// family just declared (histograms and summaries are not written here,
/// so no suffixes are allowed), a sample before any family, a bad name, a
/// label value with an unescaped quote or a value that is not a number.
/// An empty list means the page is sound.
pub fn check(page: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut current: Option<&str> = None;
    let mut series = std::collections::HashSet::new();
    for (n, line) in page.lines().enumerate() {
        let n = n + 1;
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or("");
            if !valid_name(name, true) {
                problems.push(format!("line {n}: bad family name {name:?}"));
            }
            if !seen.insert(name) {
                problems.push(format!("line {n}: family {name} declared twice"));
            }
            current = Some(name);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let (name, kind) = (words.next(), words.next());
            if name != current {
                problems.push(format!(
                    "line {n}: TYPE of {name:?} after HELP of {current:?}"
                ));
            }
            if !matches!(kind, Some("counter" | "gauge")) {
                problems.push(format!("line {n}: type {kind:?}"));
            }
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else {
            match sample_parts(line) {
                Err(e) => problems.push(format!("line {n}: {e}: {line}")),
                Ok((name, key)) => {
                    if Some(name) != current {
                        problems.push(format!("line {n}: {name} outside its family ({current:?})"));
                    }
                    if !series.insert(key) {
                        problems.push(format!("line {n}: series written twice: {line}"));
                    }
                }
            }
        }
    }
    problems
}

/// Splits a sample line into its name and its series (name and labels),
/// checking the labels' syntax and the value.
fn sample_parts(line: &str) -> Result<(&str, &str), String> {
    let name_end = line.find(['{', ' ']).ok_or_else(|| "no value".to_owned())?;
    let name = &line[..name_end];
    if !valid_name(name, true) {
        return Err(format!("bad name {name:?}"));
    }
    let mut rest = &line[name_end..];
    if let Some(labels) = rest.strip_prefix('{') {
        let mut s = labels;
        loop {
            if let Some(after) = s.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = s
                .find("=\"")
                .ok_or_else(|| "label without =\"".to_owned())?;
            if !valid_name(&s[..eq], false) {
                return Err(format!("bad label name {:?}", &s[..eq]));
            }
            s = &s[eq + 2..];
            // The value runs to the first quote not escaped.
            let mut chars = s.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err("label value not closed".to_owned()),
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\' | '"' | 'n')) => {}
                        _ => return Err("bad escape in a label value".to_owned()),
                    },
                    Some((i, '"')) => break i,
                    Some(_) => {}
                }
            };
            s = &s[end + 1..];
            s = s.strip_prefix(',').unwrap_or(s);
        }
    }
    let series = &line[..line.len() - rest.len()];
    let value = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_owned())?;
    let ok = matches!(value, "NaN" | "+Inf" | "-Inf") || value.parse::<f64>().is_ok();
    if !ok {
        return Err(format!("value {value:?} is not a number"));
    }
    Ok((name, series))
}

#[cfg(test)]
mod tests;
