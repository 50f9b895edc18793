//! The TOML schema: serde structs that mirror the file, spans kept so the
//! checks in [`super::check`] can point at the offending text. Nothing here
//! validates; unknown keys are collected by `serde_ignored` in the checks.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawConfig {
    pub(super) node: Option<RawNode>,
    pub(super) fetch: Option<RawFetch>,
    pub(super) put: Option<RawPut>,
    pub(super) cache: Option<RawCache>,
    pub(super) locality: Option<RawLocality>,
    pub(super) control: Option<RawControl>,
    #[serde(default)]
    pub(super) plugin: Vec<RawPlugin>,
    #[serde(default)]
    pub(super) route: Vec<RawRoute>,
    #[serde(default)]
    pub(super) experiment: Vec<RawExperiment>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawExperiment {
    pub(super) name: Spanned<String>,
    pub(super) unit: Option<Spanned<String>>,
    pub(super) salt: Option<String>,
    pub(super) local: Option<bool>,
    pub(super) device: Option<Spanned<String>>,
    pub(super) min_size: Option<Spanned<toml::Value>>,
    pub(super) max_size: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pub(super) tags: BTreeMap<String, String>,
    pub(super) owner: Option<Spanned<String>>,
    pub(super) arms: Spanned<Vec<RawArm>>,
    pub(super) guardrail: Option<Spanned<RawGuardrail>>,
    pub(super) ramp: Option<Spanned<RawRamp>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawRamp {
    pub(super) arm: Option<Spanned<String>>,
    pub(super) steps: Spanned<Vec<Spanned<toml::Value>>>,
    pub(super) interval: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawArm {
    pub(super) name: Option<Spanned<String>>,
    pub(super) transport: Spanned<String>,
    pub(super) weight: Spanned<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawGuardrail {
    pub(super) max_error_rate: Option<Spanned<f64>>,
    pub(super) max_p99_ratio: Option<Spanned<f64>>,
    pub(super) window: Option<Spanned<String>>,
    pub(super) min_samples: Option<Spanned<i64>>,
    pub(super) cooldown: Option<Spanned<String>>,
    pub(super) max_cooldown: Option<Spanned<String>>,
    pub(super) probe_share: Option<Spanned<f64>>,
}

/// The conditions of a `[[route]]` or `[[experiment]]`, as written.
pub(super) struct RawWhen<'a> {
    pub(super) local: Option<bool>,
    pub(super) device: &'a Option<Spanned<String>>,
    pub(super) min_size: &'a Option<Spanned<toml::Value>>,
    pub(super) max_size: &'a Option<Spanned<toml::Value>>,
    pub(super) tags: &'a BTreeMap<String, String>,
    pub(super) owner: &'a Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawRoute {
    pub(super) name: Option<Spanned<String>>,
    pub(super) local: Option<bool>,
    pub(super) device: Option<Spanned<String>>,
    pub(super) min_size: Option<Spanned<toml::Value>>,
    pub(super) max_size: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pub(super) tags: BTreeMap<String, String>,
    pub(super) owner: Option<Spanned<String>>,
    pub(super) transports: Spanned<Vec<Spanned<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawNode {
    pub(super) name: Option<Spanned<String>>,
    pub(super) advertise: Option<Spanned<String>>,
    pub(super) max_shard_size: Option<Spanned<toml::Value>>,
    pub(super) sweep_interval: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawFetch {
    pub(super) mode: Option<Spanned<String>>,
    pub(super) on_downgrade: Option<Spanned<String>>,
    pub(super) verify_checksum: Option<bool>,
    pub(super) max_batch: Option<Spanned<i64>>,
    pub(super) exhausted_wait: Option<Spanned<String>>,
    pub(super) copy_buffers: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawPut {
    pub(super) storage: Option<Spanned<String>>,
    pub(super) pool_transport: Option<Spanned<String>>,
    pub(super) checksum: Option<Spanned<String>>,
    pub(super) export_to: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawCache {
    pub(super) policy: Option<Spanned<toml::Value>>,
    pub(super) max_bytes: Option<Spanned<toml::Value>>,
    pub(super) ttl: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawControl {
    pub(super) bind: Option<Spanned<String>>,
    pub(super) auth_token: Option<Spanned<String>>,
    pub(super) auth_token_env: Option<Spanned<String>>,
    pub(super) tls_cert: Option<Spanned<String>>,
    pub(super) tls_key: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawLocality {
    pub(super) same_node: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawPlugin {
    pub(super) name: Spanned<String>,
    pub(super) transport: Option<Spanned<String>>,
    pub(super) path: Spanned<String>,
    pub(super) sha256: Option<Spanned<String>>,
    pub(super) required: Option<bool>,
    pub(super) config: Option<toml::Table>,
    pub(super) faults: Option<Spanned<RawFaults>>,
}

/// `[plugin.faults]`: fault injection in front of the plugin.
#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub(super) struct RawFaults {
    pub(super) seed: Option<Spanned<i64>>,
    pub(super) delay: Option<Spanned<String>>,
    pub(super) delay_rate: Option<Spanned<f64>>,
    pub(super) reset: Option<Spanned<f64>>,
    pub(super) short_read: Option<Spanned<f64>>,
    pub(super) corrupt: Option<Spanned<f64>>,
    pub(super) enospc: Option<Spanned<f64>>,
    pub(super) garbage_descriptor: Option<Spanned<f64>>,
}
