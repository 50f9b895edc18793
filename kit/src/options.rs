//! Typed access to a plugin's own config table.
//!
//! The host passes each plugin its `[plugin.config]` table as TOML text. A
//! plugin reads it through [`Options`], whose getters name the offending
//! key (`plugin.<instance>.config.<key>`) and say what was expected, and whose
//! [`finish`](Options::finish) refuses keys nobody read (a typo in
//! `pool-size` must not silently fall back to the default).
//!
//! Values: strings, one of a set of choices, integers in a range, booleans,
//! byte sizes (`"512MiB"` or an integer of bytes) and durations (`"250ms"`,
//! `"5s"`, `"2m"`; a bare number is refused, its unit would be a guess).
//! Checks of the plugin's own (a name's charset, a cross-key rule) report
//! through [`Options::fail`], so every message has the same shape:
//! `` `plugin.shm.config.pool-size`: 1 KiB is out of range 4 KiB..=1 TiB ``.

use std::{cell::RefCell, collections::BTreeSet, ops::RangeInclusive, time::Duration};

use shardport_abi::error::{AbiError, PluginResult};

/// A parsed plugin config table.
#[derive(Debug)]
pub struct Options {
    instance: String,
    table: toml::Table,
    read: RefCell<BTreeSet<String>>,
}

impl Options {
    /// Parses `text` (the table as TOML) for plugin instance `instance`.
    pub fn parse(instance: &str, text: &str) -> PluginResult<Self> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            AbiError::config(format!(
                "plugin `{instance}` config is not valid TOML: {}",
                e.message()
            ))
        })?;
        Ok(Options {
            instance: instance.to_owned(),
            table,
            read: RefCell::default(),
        })
    }

    /// The dotted path of `key` in the host config (`plugin.shm.config.pool-size`).
    pub fn path(&self, key: &str) -> String {
        format!("plugin.{}.config.{key}", self.instance)
    }

    /// A `CONFIG` error about `key`: `` `plugin.<instance>.config.<key>`: {why} ``.
    pub fn fail(&self, key: &str, why: impl std::fmt::Display) -> AbiError {
        AbiError::config(format!("`{}`: {why}", self.path(key)))
    }

    /// The instance name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// A string that must be present; `example` shows a valid line.
    pub fn required_string(&self, key: &str, example: &str) -> PluginResult<String> {
        self.opt_string(key)?.ok_or_else(|| {
            AbiError::config(format!("`{}` is required, e.g. {example}", self.path(key)))
        })
    }

    /// A byte size (see [`byte_size`](Self::byte_size)) within `range`.
    pub fn byte_size_in(
        &self,
        key: &str,
        range: RangeInclusive<u64>,
        default: u64,
    ) -> PluginResult<u64> {
        let v = self.byte_size(key, default)?;
        if range.contains(&v) {
            return Ok(v);
        }
        Err(self.fail(
            key,
            format_args!(
                "{} is out of range {}..={}",
                format_byte_size(v),
                format_byte_size(*range.start()),
                format_byte_size(*range.end())
            ),
        ))
    }

    /// A duration string (see [`parse_duration`]), or `None` when absent.
    pub fn opt_duration(&self, key: &str) -> PluginResult<Option<Duration>> {
        let Some(text) = self.opt_string(key)? else {
            return Ok(None);
        };
        parse_duration(&text).map(Some).ok_or_else(|| {
            self.fail(
                key,
                format_args!(
                    "expected a duration such as \"250ms\", \"5s\" or \"50us\", found \"{text}\""
                ),
            )
        })
    }

    /// A duration within `range`, with a default.
    pub fn duration_in(
        &self,
        key: &str,
        range: RangeInclusive<Duration>,
        default: Duration,
    ) -> PluginResult<Duration> {
        let d = self.opt_duration(key)?.unwrap_or(default);
        if range.contains(&d) {
            return Ok(d);
        }
        Err(self.fail(
            key,
            format_args!(
                "{} is out of range {}..={}",
                format_duration(d),
                format_duration(*range.start()),
                format_duration(*range.end())
            ),
        ))
    }

    /// One of `choices` (config text, value), with the default's text.
    pub fn choose<T: Copy>(
        &self,
        key: &str,
        choices: &[(&str, T)],
        default: &str,
    ) -> PluginResult<T> {
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let picked = self.choice(key, &names, default)?;
        choices
            .iter()
            .find(|(n, _)| *n == picked)
            .map(|(_, v)| *v)
            .ok_or_else(|| self.fail(key, format_args!("the default {default:?} is not a choice")))
    }

    fn get(&self, key: &str) -> Option<&toml::Value> {
        self.read.borrow_mut().insert(key.to_owned());
        self.table.get(key)
    }

    fn wrong(&self, key: &str, expected: &str, found: &toml::Value) -> AbiError {
        AbiError::config(format!(
            "`{}`: expected {expected}, found {}",
            self.path(key),
            render(found)
        ))
    }

    /// A string, or `None` when absent.
    pub fn opt_string(&self, key: &str) -> PluginResult<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.wrong(key, "a string", v)),
        }
    }

    /// A string with a default.
    pub fn string(&self, key: &str, default: &str) -> PluginResult<String> {
        Ok(self.opt_string(key)?.unwrap_or_else(|| default.to_owned()))
    }

    /// One of `choices`, with a default.
    pub fn choice(&self, key: &str, choices: &[&str], default: &str) -> PluginResult<String> {
        let value = self.string(key, default)?;
        if choices.contains(&value.as_str()) {
            Ok(value)
        } else {
            let expected = choices
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(" or ");
            Err(AbiError::config(format!(
                "`{}`: expected {expected}, found \"{value}\"",
                self.path(key)
            )))
        }
    }

    /// A non-negative integer within `range`, with a default.
    pub fn u64_in(
        &self,
        key: &str,
        range: std::ops::RangeInclusive<u64>,
        default: u64,
    ) -> PluginResult<u64> {
        let v = match self.get(key) {
            None => return Ok(default),
            Some(toml::Value::Integer(i)) if *i >= 0 => *i as u64,
            Some(v) => return Err(self.wrong(key, "a non-negative integer", v)),
        };
        if range.contains(&v) {
            Ok(v)
        } else {
            Err(AbiError::config(format!(
                "`{}`: {v} is out of range {}..={}",
                self.path(key),
                range.start(),
                range.end()
            )))
        }
    }

    /// A boolean with a default.
    pub fn bool(&self, key: &str, default: bool) -> PluginResult<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(toml::Value::Boolean(b)) => Ok(*b),
            Some(v) => Err(self.wrong(key, "true or false", v)),
        }
    }

    /// A byte size: an integer of bytes or a string such as `"512MiB"`, `"1 GiB"`, `"64k"`.
    pub fn byte_size(&self, key: &str, default: u64) -> PluginResult<u64> {
        match self.get(key) {
            None => Ok(default),
            Some(toml::Value::Integer(i)) if *i >= 0 => Ok(*i as u64),
            Some(toml::Value::String(s)) => parse_byte_size(s).ok_or_else(|| {
                AbiError::config(format!(
                    "`{}`: expected a byte size such as \"512MiB\" or an integer, found \"{s}\"",
                    self.path(key)
                ))
            }),
            Some(v) => Err(self.wrong(key, "a byte size such as \"512MiB\"", v)),
        }
    }

    /// Fails naming every key that no getter asked for.
    pub fn finish(self) -> PluginResult<()> {
        let read = self.read.borrow();
        let unknown: Vec<String> = self
            .table
            .keys()
            .filter(|k| !read.contains(*k))
            .map(|k| format!("`{}`", self.path(k)))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            let known: Vec<&str> = read.iter().map(String::as_str).collect();
            Err(AbiError::config(format!(
                "unknown key {} (known keys: {})",
                unknown.join(", "),
                known.join(", ")
            )))
        }
    }
}

/// Parses a duration: an integer with a unit `us`, `ms`, `s`, `m` (or
/// `min`) or `h` (`"50us"`, `"250ms"`, `"5s"`, `"2m"`). A bare number is
/// refused: its unit would be a guess.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let us_per: u64 = match unit.trim() {
        "us" => 1,
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" | "min" => 60_000_000,
        "h" => 3_600_000_000,
        _ => return None,
    };
    n.checked_mul(us_per).map(Duration::from_micros)
}

/// Renders a duration the way the config writes it, in the largest unit
/// that divides it (`"2m"`, `"1500ms"`, `"50us"`, `"0s"`).
pub fn format_duration(d: Duration) -> String {
    let us = d.as_micros();
    if us == 0 {
        return "0s".to_owned();
    }
    for (per, unit) in [
        (3_600_000_000u128, "h"),
        (60_000_000, "m"),
        (1_000_000, "s"),
        (1_000, "ms"),
    ] {
        if us % per == 0 {
            return format!("{}{unit}", us / per);
        }
    }
    format!("{us}us")
}

fn render(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("\"{s}\""),
        other => format!("{} `{other}`", other.type_str()),
    }
}

/// Parses a byte size: plain digits are bytes; suffixes `k`/`KiB`/`KB`,
/// `m`/`MiB`/`MB`, `g`/`GiB`/`GB`, `t`/`TiB`/`TB` (all powers of 1024,
/// case-insensitive, optional space, optional trailing `B`).
pub fn parse_byte_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit.strip_suffix('b').unwrap_or(&unit);
    let unit = unit.strip_suffix('i').unwrap_or(unit);
    let shift = match unit {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// Renders a byte count with a binary unit (`256 MiB`), for messages.
pub fn format_byte_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_byte_size("1 GiB"), Some(1 << 30));
        assert_eq!(parse_byte_size("64k"), Some(64 << 10));
        assert_eq!(parse_byte_size("100"), Some(100));
        assert_eq!(parse_byte_size("2gb"), Some(2 << 30));
        assert_eq!(parse_byte_size("12 parsecs"), None);
        assert_eq!(parse_byte_size(""), None);
        assert_eq!(parse_byte_size("99999999999T"), None);
        assert_eq!(format_byte_size(256 << 20), "256 MiB");
        assert_eq!(format_byte_size(1536), "1.5 KiB");
    }

    #[test]
    fn errors_name_the_key() {
        let t = Options::parse("shm", "pool-size = \"lots\"\nmode = 3\ntypo = 1").unwrap();
        let e = t.byte_size("pool-size", 1).unwrap_err();
        assert_eq!(
            e.message.as_str(),
            "`plugin.shm.config.pool-size`: expected a byte size such as \"512MiB\" or an integer, found \"lots\""
        );
        let e = t.choice("mode", &["a", "b"], "a").unwrap_err();
        assert_eq!(
            e.message.as_str(),
            "`plugin.shm.config.mode`: expected a string, found integer `3`"
        );
        let e = t.finish().unwrap_err();
        assert_eq!(
            e.message.as_str(),
            "unknown key `plugin.shm.config.typo` (known keys: mode, pool-size)"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("50us"), Some(Duration::from_micros(50)));
        assert_eq!(parse_duration(" 2 ms "), Some(Duration::from_millis(2)));
        assert_eq!(parse_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("2min"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0us"), Some(Duration::ZERO));
        for bad in [
            "",
            "5",
            "us",
            "1.5ms",
            "-1us",
            "2d",
            "99999999999999999999s",
            "999999999999999h",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(50), "50us"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(86400), "24h"),
        ] {
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Some(d));
        }
    }

    #[test]
    fn typed_getters() {
        let t = Options::parse(
            "x",
            "t = \"5s\"\nslow = \"2h\"\nbad = \"5\"\nsize = \"2KiB\"\nmode = \"b\"",
        )
        .unwrap();
        let range = Duration::from_millis(1)..=Duration::from_secs(60);
        assert_eq!(
            t.duration_in("t", range.clone(), Duration::ZERO).unwrap(),
            Duration::from_secs(5)
        );
        assert_eq!(
            t.duration_in("absent", range.clone(), Duration::from_secs(1))
                .unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(
            t.duration_in("slow", range.clone(), Duration::ZERO)
                .unwrap_err()
                .message
                .as_str(),
            "`plugin.x.config.slow`: 2h is out of range 1ms..=1m"
        );
        assert!(t
            .duration_in("bad", range, Duration::ZERO)
            .unwrap_err()
            .message
            .starts_with("`plugin.x.config.bad`: expected a duration such as"));
        assert_eq!(
            t.byte_size_in("size", 4096..=8192, 4096)
                .unwrap_err()
                .message
                .as_str(),
            "`plugin.x.config.size`: 2 KiB is out of range 4 KiB..=8 KiB"
        );
        assert_eq!(t.choose("mode", &[("a", 1), ("b", 2)], "a").unwrap(), 2);
        assert_eq!(
            t.required_string("dir", "dir = \"/x\"")
                .unwrap_err()
                .message
                .as_str(),
            "`plugin.x.config.dir` is required, e.g. dir = \"/x\""
        );
        assert_eq!(
            t.fail("k", "why").message.as_str(),
            "`plugin.x.config.k`: why"
        );
        t.finish().unwrap();
    }

    #[test]
    fn hostile_tables_fail_cleanly() {
        for text in ["[", "a = ", "a = 1\na = 2", "= 3", "a = \"\\u{0}\""] {
            let e = Options::parse("x", text).unwrap_err();
            assert_eq!(e.kind, shardport_abi::ErrorKind::CONFIG, "{text}");
            assert!(
                e.message.starts_with("plugin `x` config is not valid TOML"),
                "{text}"
            );
        }
        let t = Options::parse("x", "n = 99999999999\nneg = -5\nf = 1.5").unwrap();
        assert!(t
            .u64_in("n", 0..=10, 0)
            .unwrap_err()
            .message
            .contains("out of range"));
        assert!(t.byte_size("neg", 0).is_err());
        assert!(t.bool("f", false).is_err());
    }

    #[test]
    fn choice_lists_alternatives() {
        let t = Options::parse("shm", "allocation = \"buddy\"").unwrap();
        let e = t
            .choice("allocation", &["pool", "segment-per-shard"], "pool")
            .unwrap_err();
        assert_eq!(
            e.message.as_str(),
            "`plugin.shm.config.allocation`: expected \"pool\" or \"segment-per-shard\", found \"buddy\""
        );
    }
}
