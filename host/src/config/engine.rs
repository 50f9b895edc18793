//! Engine overrides: the address and name a process takes from the engine
//! that started it (Ray, torchrun, Kubernetes), applied to a config.
//!
//! The embedding program reads the engine's environment (the Python
//! package's `shardport.env`); what that changes in a config is decided
//! here, once, for both forms a config takes:
//! - [`EngineOverrides::apply`] on a validated [`Config`]: what a node
//!   starts with, and (as its reload hook) what every reloaded config goes
//!   through, so that a node started with overrides reloads its own file
//!   unchanged and a bad value still points at `file:line:col`;
//! - [`EngineOverrides::apply_table`] on the TOML table as written, for a
//!   program that wants the edited config back (`shardport.env.apply`).
//!
//! What changes: `node.name` (when given), `node.advertise` (the address,
//! the configured port kept), and the `bind` of every http transport (see
//! [`EngineOverrides`]). Every other key stays as written.

use std::net::IpAddr;

use super::{Config, ConfigError, MAX_ADDR};

/// The transport whose listening address the overrides move.
const HTTP: &str = "http";

/// `bind` of an http transport that sets none (its own default).
const DEFAULT_HTTP_BIND: &str = "127.0.0.1:0";

/// `node.advertise` of a table that sets none (the checked config's default).
const DEFAULT_ADVERTISE: &str = "127.0.0.1:0";

/// What the engine's environment says about this process.
///
/// Applied to an http transport's table (`plugin.<name>.config`): `bind`
/// becomes `<host>:<port>` with its configured port when `host` is not
/// loopback, so consumers on other machines reach it; a `bind` on the
/// unspecified address (`0.0.0.0:7071`) is kept and `advertise` set to
/// `host` instead; loopback stays loopback. A transport that would then
/// serve beyond loopback without `auth-token`/`auth-token-env` is reported
/// (see [`Exposed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOverrides {
    /// The node name (`None`: keep the config's).
    pub name: Option<String>,
    /// The address other processes reach this node at (an IP address or a
    /// host name).
    pub host: String,
}

/// An http transport the overrides made serve shard bytes beyond loopback
/// with no auth token; `Display` is the warning to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposed {
    /// The transport's instance name.
    pub plugin: String,
    /// Where it will listen.
    pub bind: String,
}

impl std::fmt::Display for Exposed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} transport will serve shard bytes on {} with no auth token: set plugin.{}.config.auth-token-env",
            self.plugin, self.bind, self.plugin
        )
    }
}

impl EngineOverrides {
    /// Applies the overrides to a checked config. An http table whose
    /// `bind` is not `host:port` is an error at that key (`file:line:col`).
    pub fn apply(&self, cfg: &mut Config) -> Result<Vec<Exposed>, ConfigError> {
        if let Some(name) = &self.name {
            cfg.node.name.clone_from(name);
            cfg.node.name_given = true;
        }
        let advertise = self
            .advertise(&cfg.node.advertise)
            .map_err(|message| ConfigError {
                origin: cfg.origin.display(),
                line: 0,
                col: 0,
                message,
                source_line: String::new(),
                width: 0,
                help: None,
            })?;
        cfg.node.advertise = advertise;
        let mut exposed = Vec::new();
        for p in cfg
            .plugins
            .iter_mut()
            .filter(|p| p.transport.as_str() == HTTP)
        {
            let instance = p.name.to_string();
            let at = |message: String| p.config_places.error(&instance, message);
            let mut table: toml::Table = toml::from_str(&p.config_text).map_err(|e| {
                at(format!(
                    "`plugin.{instance}.config` cannot be read back: {e}"
                ))
            })?;
            exposed.extend(self.http(&instance, &mut table).map_err(&at)?);
            p.config_text = toml::to_string(&table).map_err(|e| {
                at(format!(
                    "`plugin.{instance}.config` cannot be rendered: {e}"
                ))
            })?;
        }
        Ok(exposed)
    }

    /// Applies the overrides to a config table as written (`[node]`, every
    /// `[[plugin]]` whose `transport`, or else `name`, is `http`).
    pub fn apply_table(&self, table: &mut toml::Table) -> Result<Vec<Exposed>, String> {
        let node = table
            .entry("node")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or("`node`: expected a table")?;
        if let Some(name) = &self.name {
            node.insert("name".to_owned(), toml::Value::String(name.clone()));
        }
        let written = match node.get("advertise") {
            None => DEFAULT_ADVERTISE.to_owned(),
            Some(v) => v
                .as_str()
                .ok_or_else(|| format!("`node.advertise`: expected `host:port`, found {v}"))?
                .to_owned(),
        };
        node.insert(
            "advertise".to_owned(),
            toml::Value::String(self.advertise(&written)?),
        );
        let mut exposed = Vec::new();
        let plugins = table.get_mut("plugin").and_then(toml::Value::as_array_mut);
        for p in plugins
            .into_iter()
            .flatten()
            .filter_map(toml::Value::as_table_mut)
        {
            let str_of = |k: &str| p.get(k).and_then(toml::Value::as_str).map(str::to_owned);
            let instance = str_of("name").unwrap_or_default();
            if str_of("transport").unwrap_or_else(|| instance.clone()) != HTTP {
                continue;
            }
            let pc = p
                .entry("config")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| format!("`plugin.{instance}.config`: expected a table"))?;
            exposed.extend(self.http(&instance, pc)?);
        }
        Ok(exposed)
    }

    /// `advertise` (`host:port`) with the host replaced, the port kept.
    fn advertise(&self, advertise: &str) -> Result<String, String> {
        let (_, port) = split_host_port(advertise).ok_or_else(|| {
            format!("`node.advertise`: expected `host:port`, found \"{advertise}\"")
        })?;
        let out = join_host_port(&self.host, port);
        if out.len() > MAX_ADDR {
            return Err(format!(
                "`node.advertise`: `{out}` is longer than {MAX_ADDR} bytes"
            ));
        }
        Ok(out)
    }

    /// One http transport's table (see [`EngineOverrides`]).
    fn http(&self, instance: &str, pc: &mut toml::Table) -> Result<Option<Exposed>, String> {
        let bind = match pc.get("bind") {
            None => DEFAULT_HTTP_BIND.to_owned(),
            Some(v) => v
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| v.to_string()),
        };
        let (bind_host, port) = split_host_port(&bind).ok_or_else(|| {
            format!("`plugin.{instance}.config.bind`: expected `host:port`, found \"{bind}\"")
        })?;
        let serving = if is_unspecified(bind_host) {
            pc.entry("advertise")
                .or_insert_with(|| toml::Value::String(self.host.clone()));
            bind
        } else if !is_loopback(&self.host) {
            let moved = join_host_port(&self.host, port);
            pc.insert("bind".to_owned(), toml::Value::String(moved.clone()));
            moved
        } else {
            return Ok(None); // loopback stays loopback
        };
        let guarded = pc.contains_key("auth-token") || pc.contains_key("auth-token-env");
        Ok((!guarded).then(|| Exposed {
            plugin: instance.to_owned(),
            bind: serving,
        }))
    }
}

/// `host:port` split at its last colon (`[v6]:port` unbracketed); `None`
/// when either part is missing or the port is not a port.
fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then_some(())?;
    Some((host, port.parse().ok()?))
}

/// `host:port`, an IPv6 address in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn is_loopback(host: &str) -> bool {
    host.parse::<IpAddr>().map_or_else(
        |_| host.eq_ignore_ascii_case("localhost"),
        |ip| ip.is_loopback(),
    )
}

fn is_unspecified(host: &str) -> bool {
    host.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::{parse_str, Origin};

    fn pod(host: &str) -> EngineOverrides {
        EngineOverrides {
            name: Some("trainer-0".into()),
            host: host.into(),
        }
    }

    fn checked(text: &str) -> Config {
        let origin = Origin::File(PathBuf::from("/etc/sp/node.toml"));
        parse_str(text, origin).unwrap()
    }

    const HTTP_NODE: &str = "[node]\nadvertise = \"127.0.0.1:9\"\n\n[[plugin]]\nname = \"web\"\ntransport = \"http\"\npath = \"libshardport_http.so\"\n[plugin.config]\nbind = \"127.0.0.1:7071\"\n";

    #[test]
    fn a_checked_config_takes_the_name_the_address_and_the_http_bind() {
        let mut c = checked(HTTP_NODE);
        let exposed = pod("10.1.2.3").apply(&mut c).unwrap();
        assert_eq!(
            (c.node.name.as_str(), c.node.name_given),
            ("trainer-0", true)
        );
        assert_eq!(c.node.advertise, "10.1.2.3:9"); // the port kept
        let t: toml::Table = toml::from_str(&c.plugins[0].config_text).unwrap();
        assert_eq!(t["bind"].as_str(), Some("10.1.2.3:7071"));
        assert_eq!(
            exposed.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["the web transport will serve shard bytes on 10.1.2.3:7071 with no auth token: set plugin.web.config.auth-token-env"]
        );
        // Applying again changes nothing more (a reload hook runs on every config).
        let again = c.clone();
        pod("10.1.2.3").apply(&mut c).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn loopback_stays_loopback_and_a_token_silences_the_warning() {
        let mut c = checked(HTTP_NODE);
        assert!(pod("127.0.0.1").apply(&mut c).unwrap().is_empty());
        let t: toml::Table = toml::from_str(&c.plugins[0].config_text).unwrap();
        assert_eq!(t["bind"].as_str(), Some("127.0.0.1:7071"));
        let guarded = HTTP_NODE.replace(
            "[plugin.config]\n",
            "[plugin.config]\nauth-token-env = \"T\"\n",
        );
        let mut c = checked(&guarded);
        assert!(pod("10.1.2.3").apply(&mut c).unwrap().is_empty());
    }

    #[test]
    fn an_unspecified_bind_is_kept_and_advertised_at_the_host() {
        let text = HTTP_NODE.replace("127.0.0.1:7071", "0.0.0.0:7071");
        let mut c = checked(&text);
        let exposed = pod("fd00::5").apply(&mut c).unwrap();
        assert_eq!(c.node.advertise, "[fd00::5]:9");
        let t: toml::Table = toml::from_str(&c.plugins[0].config_text).unwrap();
        assert_eq!(t["bind"].as_str(), Some("0.0.0.0:7071"));
        assert_eq!(t["advertise"].as_str(), Some("fd00::5"));
        assert_eq!(exposed[0].bind, "0.0.0.0:7071");
    }

    #[test]
    fn a_bad_bind_points_at_its_place_in_the_file() {
        let text = HTTP_NODE.replace("127.0.0.1:7071", "nohostport");
        let e = pod("10.1.2.3").apply(&mut checked(&text)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`plugin.web.config.bind`: expected `host:port`, found \"nohostport\"\n --> /etc/sp/node.toml:9:1\n  |\n9 | bind = \"nohostport\"\n  | ^^^^"
        );
    }

    #[test]
    fn a_table_as_written_gets_the_same_overrides() {
        let mut t: toml::Table = toml::from_str(HTTP_NODE).unwrap();
        let exposed = pod("10.1.2.3").apply_table(&mut t).unwrap();
        assert_eq!(t["node"]["name"].as_str(), Some("trainer-0"));
        assert_eq!(t["node"]["advertise"].as_str(), Some("10.1.2.3:9"));
        assert_eq!(
            t["plugin"][0]["config"]["bind"].as_str(),
            Some("10.1.2.3:7071")
        );
        assert_eq!(exposed.len(), 1);
        // No [node], an http plugin without a table: the defaults' ports.
        let mut t: toml::Table =
            toml::from_str("[[plugin]]\nname = \"http\"\npath = \"h.so\"\n").unwrap();
        pod("10.1.2.3").apply_table(&mut t).unwrap();
        assert_eq!(t["node"]["advertise"].as_str(), Some("10.1.2.3:0"));
        assert_eq!(
            t["plugin"][0]["config"]["bind"].as_str(),
            Some("10.1.2.3:0")
        );
        let mut bad: toml::Table = toml::from_str("[node]\nadvertise = \"nohostport\"\n").unwrap();
        let e = pod("10.1.2.3").apply_table(&mut bad).unwrap_err();
        assert!(
            e.starts_with("`node.advertise`: expected `host:port`"),
            "{e}"
        );
    }
}
