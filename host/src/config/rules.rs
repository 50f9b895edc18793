//! The checks of `[[route]]` and `[[experiment]]` tables: their conditions,
//! transport lists, arms, guardrails and ramps.

use toml::Spanned;

use super::{
    check::{loads, Ctx},
    schema::{RawArm, RawExperiment, RawGuardrail, RawRamp, RawRoute, RawWhen},
    span::ConfigError,
    AddrPattern, Arm, DeviceSel, Experiment, ExperimentUnit, Guardrail, PluginSpec, Ramp, Route,
    RouteWhen, DEFAULT_COOLDOWN_WINDOWS, DEFAULT_GUARDRAIL_MIN_SAMPLES, DEFAULT_GUARDRAIL_WINDOW,
    DEFAULT_MAX_COOLDOWN, DEFAULT_PROBE_SHARE, MAX_ARMS,
};

/// Shown with every error about an experiment's arms.
const ARMS_HELP: &str = "example: arms = [{ transport = \"posix-shm\", weight = 90 }, { transport = \"http\", weight = 10 }]";

/// Longest experiment or arm name.
const MAX_LABEL: usize = 64;

impl Ctx<'_> {
    /// `[[route]]` tables, in match order.
    pub(super) fn routes(
        &self,
        raw: Vec<RawRoute>,
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Route>, ConfigError> {
        let mut routes = Vec::new();
        for (i, r) in raw.into_iter().enumerate() {
            let key = format!("route[{i}]");
            let when = self.when(
                &key,
                RawWhen {
                    local: r.local,
                    device: &r.device,
                    min_size: &r.min_size,
                    max_size: &r.max_size,
                    tags: &r.tags,
                    owner: &r.owner,
                },
            )?;
            let transports = self.route_transports(&key, &r.transports, plugins, warnings)?;
            routes.push(Route {
                name: r.name.map(Spanned::into_inner).unwrap_or(key),
                when,
                transports,
            });
        }
        Ok(routes)
    }

    /// A route's `transports`: not empty, no name twice.
    fn route_transports(
        &self,
        key: &str,
        list: &Spanned<Vec<Spanned<String>>>,
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Vec<super::TransportName>, ConfigError> {
        if list.get_ref().is_empty() {
            return Err(self.error(
                Some(list.span()),
                format!("`{key}.transports` is empty: a route needs at least one transport to try"),
                Some("example: transports = [\"posix-shm\", \"http\"]"),
            ));
        }
        let mut transports = Vec::new();
        for (j, t) in list.get_ref().iter().enumerate() {
            let name = self.transport(&format!("{key}.transports[{j}]"), t)?;
            if transports.contains(&name) {
                return Err(self.error(
                    Some(t.span()),
                    format!("`{key}.transports[{j}]`: `{name}` is listed twice"),
                    None,
                ));
            }
            if !loads(plugins, &name) {
                warnings.push(format!(
                    "`{key}.transports[{j}]` names `{name}`, which no [[plugin]] table loads"
                ));
            }
            transports.push(name);
        }
        Ok(transports)
    }

    /// `[[experiment]]` tables, in match order; names are unique.
    pub(super) fn experiments(
        &self,
        raw: &[RawExperiment],
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Experiment>, ConfigError> {
        let experiments = raw
            .iter()
            .enumerate()
            .map(|(i, e)| self.experiment(i, e, plugins, warnings))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, e) in experiments.iter().enumerate() {
            if experiments[..i].iter().any(|o| o.name == e.name) {
                return Err(self.error(
                    Some(raw[i].name.span()),
                    format!("`experiment[{i}].name`: `{}` is used twice", e.name),
                    None,
                ));
            }
        }
        Ok(experiments)
    }

    /// Validates the conditions of a route or experiment at `key`.
    fn when(&self, key: &str, r: RawWhen<'_>) -> Result<RouteWhen, ConfigError> {
        let size = |name: &str, v: &Option<Spanned<toml::Value>>| {
            v.as_ref()
                .map(|v| self.byte_size(&format!("{key}.{name}"), v, false, "1MiB"))
                .transpose()
        };
        let min_size = size("min-size", r.min_size)?;
        let max_size = size("max-size", r.max_size)?;
        if let (Some(lo), Some(hi)) = (min_size, max_size) {
            if lo > hi {
                return Err(self.error(
                    r.max_size.as_ref().map(Spanned::span),
                    format!(
                        "`{key}`: max-size ({hi}) is below min-size ({lo}); it could never match"
                    ),
                    None,
                ));
            }
        }
        let device = self.choice(
            &format!("{key}.device"),
            r.device,
            &[
                ("cpu", Some(DeviceSel::Cpu)),
                ("cuda", Some(DeviceSel::Cuda)),
            ],
            None,
        )?;
        let owner = match r.owner {
            Some(p) if p.get_ref().is_empty() || p.get_ref().len() > 255 => {
                return Err(self.error(
                    Some(p.span()),
                    format!("`{key}.owner`: expected an address pattern of 1..=255 characters"),
                    Some("example: owner = \"10.0.*:7070\""),
                ))
            }
            Some(p) => Some(AddrPattern::new(p.get_ref())),
            None => None,
        };
        Ok(RouteWhen {
            local: r.local,
            device,
            min_size,
            max_size,
            tags: r.tags.clone(),
            owner,
        })
    }

    /// Validates `[[experiment]]` number `i`.
    fn experiment(
        &self,
        i: usize,
        e: &RawExperiment,
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Experiment, ConfigError> {
        let key = format!("experiment[{i}]");
        let name = e.name.get_ref().trim();
        if !is_label(name) {
            return Err(self.error(
                Some(e.name.span()),
                format!(
                    "`{key}.name`: expected 1..={MAX_LABEL} characters of [A-Za-z0-9._-], found \"{}\"",
                    e.name.get_ref()
                ),
                Some("example: name = \"shm-vs-http\""),
            ));
        }
        let when = self.when(
            &key,
            RawWhen {
                local: e.local,
                device: &e.device,
                min_size: &e.min_size,
                max_size: &e.max_size,
                tags: &e.tags,
                owner: &e.owner,
            },
        )?;
        let unit = self.choice(
            &format!("{key}.unit"),
            &e.unit,
            &[
                ("shard", ExperimentUnit::Shard),
                ("fetch", ExperimentUnit::Fetch),
            ],
            ExperimentUnit::Shard,
        )?;
        let arms = self.arms(&key, &e.arms, plugins, warnings)?;
        let guardrail = match &e.guardrail {
            None => None,
            Some(g) => Some(self.guardrail(&format!("{key}.guardrail"), g)?),
        };
        let ramp = match &e.ramp {
            None => None,
            Some(r) => Some(self.ramp(&format!("{key}.ramp"), r, &arms)?),
        };
        // Weight 0 drains an arm and keeps it configured, but something
        // must carry the traffic: a ramp's share is of the other arms'.
        let carrying: u64 = arms
            .iter()
            .enumerate()
            .filter(|(i, _)| ramp.as_ref().is_none_or(|r| r.arm != *i))
            .map(|(_, a)| u64::from(a.weight))
            .sum();
        if carrying == 0 {
            return Err(self.error(
                Some(e.arms.span()),
                format!(
                    "`{key}.arms`: every arm{} has weight 0; at least one must carry the traffic (weight 0 drains an arm and keeps it configured)",
                    if ramp.is_some() { " but the ramped one" } else { "" }
                ),
                Some(ARMS_HELP),
            ));
        }
        Ok(Experiment {
            name: name.to_owned(),
            when,
            unit,
            salt: e.salt.clone().unwrap_or_else(|| name.to_owned()),
            arms,
            guardrail,
            ramp,
        })
    }

    /// An experiment's `ramp` at `rkey`: an arm other than the control
    /// (the last arm when not named), 1..=16 strictly increasing percentages
    /// in `(0, 100]`, and an interval.
    fn ramp(&self, rkey: &str, r: &Spanned<RawRamp>, arms: &[Arm]) -> Result<Ramp, ConfigError> {
        const EXAMPLE: &str =
            "example: ramp = { arm = \"canary\", steps = [1, 5, 25, 50], interval = \"10m\" }";
        let raw = r.get_ref();
        let arm = match &raw.arm {
            None => arms.len() - 1,
            Some(a) => match arms.iter().position(|x| x.name == *a.get_ref()) {
                Some(0) => {
                    return Err(self.error(
                        Some(a.span()),
                        format!(
                            "`{rkey}.arm`: `{}` is the control arm; ramp a canary arm",
                            a.get_ref()
                        ),
                        Some(EXAMPLE),
                    ))
                }
                Some(i) => i,
                None => {
                    let names: Vec<&str> = arms.iter().map(|x| x.name.as_str()).collect();
                    return Err(self.error(
                        Some(a.span()),
                        format!(
                            "`{rkey}.arm`: no arm `{}` (arms: {})",
                            a.get_ref(),
                            names.join(", ")
                        ),
                        Some(EXAMPLE),
                    ));
                }
            },
        };
        let list = raw.steps.get_ref();
        if !(1..=16).contains(&list.len()) {
            return Err(self.error(
                Some(raw.steps.span()),
                format!(
                    "`{rkey}.steps`: expected 1..=16 percentages, found {}",
                    list.len()
                ),
                Some(EXAMPLE),
            ));
        }
        let mut steps: Vec<f64> = Vec::with_capacity(list.len());
        for (k, v) in list.iter().enumerate() {
            let pct = match v.get_ref() {
                toml::Value::Integer(i) => *i as f64,
                toml::Value::Float(f) => *f,
                _ => f64::NAN,
            };
            let prev = steps.last().map_or(0.0, |p| p * 100.0);
            if !(pct > prev && pct <= 100.0) {
                return Err(self.error(
                    Some(v.span()),
                    format!(
                        "`{rkey}.steps[{k}]`: expected a percentage above {prev} and at most 100 (steps only go up), found {}",
                        v.get_ref()
                    ),
                    Some(EXAMPLE),
                ));
            }
            steps.push(pct / 100.0);
        }
        let interval = self.duration(&format!("{rkey}.interval"), &raw.interval, "10m")?;
        Ok(Ramp {
            arm,
            steps,
            interval,
        })
    }

    /// An experiment's arms: 2..=[`MAX_ARMS`], one per transport, unique names.
    fn arms(
        &self,
        key: &str,
        raw: &Spanned<Vec<RawArm>>,
        plugins: &[PluginSpec],
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Arm>, ConfigError> {
        let n = raw.get_ref().len();
        if !(2..=MAX_ARMS).contains(&n) {
            return Err(self.error(
                Some(raw.span()),
                format!(
                    "`{key}.arms`: expected 2..={MAX_ARMS} arms (the first is the control), found {n}"
                ),
                Some(ARMS_HELP),
            ));
        }
        let mut arms: Vec<Arm> = Vec::new();
        for (j, a) in raw.get_ref().iter().enumerate() {
            let akey = format!("{key}.arms[{j}]");
            let arm = self.arm(&akey, a, &arms)?;
            if !loads(plugins, &arm.transport) {
                warnings.push(format!(
                    "`{akey}.transport` names `{}`, which no [[plugin]] table loads; the experiment will never apply",
                    arm.transport
                ));
            }
            arms.push(arm);
        }
        Ok(arms)
    }

    /// The arm at `akey`, checked against the arms before it.
    fn arm(&self, akey: &str, a: &RawArm, before: &[Arm]) -> Result<Arm, ConfigError> {
        let transport = self.transport(&format!("{akey}.transport"), &a.transport)?;
        if before.iter().any(|b| b.transport == transport) {
            return Err(self.error(
                Some(a.transport.span()),
                format!("`{akey}.transport`: `{transport}` already has an arm; each arm needs its own transport"),
                Some(ARMS_HELP),
            ));
        }
        let weight = self.int_in(&format!("{akey}.weight"), &a.weight, 0, 1_000_000, "10")?;
        let name = match &a.name {
            Some(n) if !is_label(n.get_ref()) => {
                return Err(self.error(
                    Some(n.span()),
                    format!(
                        "`{akey}.name`: expected 1..={MAX_LABEL} characters of [A-Za-z0-9._-], found \"{}\"",
                        n.get_ref()
                    ),
                    Some("example: name = \"canary\""),
                ))
            }
            Some(n) => n.get_ref().clone(),
            None => transport.to_string(),
        };
        if before.iter().any(|b| b.name == name) {
            return Err(self.error(
                Some(a.name.as_ref().map_or(a.transport.span(), Spanned::span)),
                format!("`{akey}`: arm name `{name}` is used twice"),
                None,
            ));
        }
        Ok(Arm {
            name,
            transport,
            weight: weight as u32,
        })
    }

    /// An experiment's `guardrail` at `gkey`: at least one limit.
    fn guardrail(&self, gkey: &str, g: &Spanned<RawGuardrail>) -> Result<Guardrail, ConfigError> {
        let span = g.span();
        let g = g.get_ref();
        let fraction =
            |name: &str, v: &Option<Spanned<f64>>, lo: f64, hi: f64, example: &str| match v {
                None => Ok(None),
                Some(v) if (lo..=hi).contains(v.get_ref()) => Ok(Some(*v.get_ref())),
                Some(v) => Err(self.error(
                    Some(v.span()),
                    format!(
                        "`{gkey}.{name}`: expected a number in {lo}..={hi}, found {}",
                        v.get_ref()
                    ),
                    Some(&format!("example: {name} = {example}")),
                )),
            };
        let max_error_rate = fraction("max-error-rate", &g.max_error_rate, 0.0, 1.0, "0.05")?;
        let max_p99_ratio = fraction("max-p99-ratio", &g.max_p99_ratio, 1.0, 1e6, "3.0")?;
        if max_error_rate.is_none() && max_p99_ratio.is_none() {
            return Err(self.error(
                Some(span),
                format!("`{gkey}` sets neither `max-error-rate` nor `max-p99-ratio`; it would never trip"),
                Some("example: guardrail = { max-error-rate = 0.05, window = \"60s\" }"),
            ));
        }
        let window = match &g.window {
            None => DEFAULT_GUARDRAIL_WINDOW,
            Some(v) => self.duration(&format!("{gkey}.window"), v, "60s")?,
        };
        let min_samples = match &g.min_samples {
            None => DEFAULT_GUARDRAIL_MIN_SAMPLES,
            Some(v) => {
                self.int_in(&format!("{gkey}.min-samples"), v, 1, 100_000_000, "100")? as u64
            }
        };
        let cooldown = match &g.cooldown {
            Some(v) if v.get_ref().trim() == "off" => None,
            Some(v) => Some(self.duration(&format!("{gkey}.cooldown"), v, "5m")?),
            None => Some(window * DEFAULT_COOLDOWN_WINDOWS),
        };
        let max_cooldown = match &g.max_cooldown {
            None => DEFAULT_MAX_COOLDOWN.max(cooldown.unwrap_or_default()),
            Some(v) => self.duration(&format!("{gkey}.max-cooldown"), v, "1h")?,
        };
        if let (Some(c), Some(m)) = (cooldown, &g.max_cooldown) {
            if max_cooldown < c {
                return Err(self.error(
                    Some(m.span()),
                    format!("`{gkey}.max-cooldown` ({max_cooldown:?}) is shorter than `cooldown` ({c:?})"),
                    None,
                ));
            }
        }
        let probe_share = fraction("probe-share", &g.probe_share, 0.0001, 1.0, "0.1")?
            .unwrap_or(DEFAULT_PROBE_SHARE);
        Ok(Guardrail {
            max_error_rate,
            max_p99_ratio,
            window,
            min_samples,
            cooldown,
            max_cooldown,
            probe_share,
        })
    }
}

/// An experiment or arm name: 1..=[`MAX_LABEL`] characters of `[A-Za-z0-9._-]`.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}
