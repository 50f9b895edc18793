//! Typed access to a plugin's own config table.
//!
//! The host passes each plugin its `[plugin.config]` table as TOML text. A
//! plugin reads it through [`ConfigTable`], whose getters name the offending
//! key (`plugin.<instance>.config.<key>`) and say what was expected, and whose
//! [`finish`](ConfigTable::finish) refuses keys nobody read (a typo in
//! `pool-size` must not silently fall back to the default).

use std::{cell::RefCell, collections::BTreeSet};

use crate::error::{AbiError, PluginResult};

/// A parsed plugin config table.
#[derive(Debug)]
pub struct ConfigTable {
    instance: String,
    table: toml::Table,
    read: RefCell<BTreeSet<String>>,
}

impl ConfigTable {
    /// Parses `text` (the table as TOML) for plugin instance `instance`.
    pub fn parse(instance: &str, text: &str) -> PluginResult<Self> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            AbiError::config(format!(
                "plugin `{instance}` config is not valid TOML: {}",
                e.message()
            ))
        })?;
        Ok(ConfigTable {
            instance: instance.to_owned(),
            table,
            read: RefCell::default(),
        })
    }

    fn path(&self, key: &str) -> String {
        format!("plugin.{}.config.{key}", self.instance)
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
        let t = ConfigTable::parse("shm", "pool-size = \"lots\"\nmode = 3\ntypo = 1").unwrap();
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
    fn choice_lists_alternatives() {
        let t = ConfigTable::parse("shm", "allocation = \"buddy\"").unwrap();
        let e = t
            .choice("allocation", &["pool", "segment-per-shard"], "pool")
            .unwrap_err();
        assert_eq!(
            e.message.as_str(),
            "`plugin.shm.config.allocation`: expected \"pool\" or \"segment-per-shard\", found \"buddy\""
        );
    }
}
