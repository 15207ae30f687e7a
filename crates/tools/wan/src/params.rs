//! Emulation parameters: parsing of the command-line values (durations, rates, sizes,
//! probabilities, loss models) and the rules that apply an update to a running configuration.

use serde::{Deserialize, Serialize};

use crate::{Result, WanError};

/// The longest one-way delay or jitter accepted (10 s).
pub const MAX_DELAY_NS: u64 = 10_000_000_000;
/// The lowest and highest rate accepted.
pub const MIN_RATE_BPS: u64 = 8_000;
pub const MAX_RATE_BPS: u64 = 100_000_000_000;

/// One direction of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dir {
    /// From the `host` namespace to the `storage` namespace.
    ToStorage,
    /// From the `storage` namespace to the `host` namespace.
    ToHost,
}

impl Dir {
    pub const ALL: [Dir; 2] = [Dir::ToStorage, Dir::ToHost];

    /// Index into per-direction arrays, and the NFQUEUE number of the direction.
    pub fn index(self) -> usize {
        match self {
            Dir::ToStorage => 0,
            Dir::ToHost => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dir::ToStorage => "host->storage",
            Dir::ToHost => "storage->host",
        }
    }
}

/// Which directions an update of delay, jitter or loss applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Directions {
    #[default]
    Both,
    ToStorage,
    ToHost,
}

impl Directions {
    pub fn includes(self, d: Dir) -> bool {
        match self {
            Directions::Both => true,
            Directions::ToStorage => d == Dir::ToStorage,
            Directions::ToHost => d == Dir::ToHost,
        }
    }

    pub fn parse(s: &str) -> Result<Directions> {
        match s.to_ascii_lowercase().as_str() {
            "both" => Ok(Directions::Both),
            "to-storage" | "up" => Ok(Directions::ToStorage),
            "to-host" | "down" => Ok(Directions::ToHost),
            _ => Err(WanError::param("direction", s, "expected both, to-storage or to-host")),
        }
    }
}

/// TCP congestion control set in both end namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cc {
    Reno,
    Cubic,
    Bbr,
}

impl Cc {
    pub fn parse(s: &str) -> Result<Cc> {
        match s.to_ascii_lowercase().as_str() {
            "reno" => Ok(Cc::Reno),
            "cubic" => Ok(Cc::Cubic),
            "bbr" => Ok(Cc::Bbr),
            _ => Err(WanError::param("congestion control", s, "expected reno, cubic or bbr")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Cc::Reno => "reno",
            Cc::Cubic => "cubic",
            Cc::Bbr => "bbr",
        }
    }
}

/// How packets are lost in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "model", rename_all = "lowercase")]
pub enum LossSpec {
    /// Each packet is lost independently with probability `p`.
    Bernoulli { p: f64 },
    /// Gilbert–Elliott: a good and a bad state; `p` = P(good → bad), `r` = P(bad → good) per
    /// packet; a packet is lost with probability `bad` in the bad state and `good` in the good one.
    Gilbert { p: f64, r: f64, bad: f64, good: f64 },
}

impl Default for LossSpec {
    fn default() -> Self {
        LossSpec::Bernoulli { p: 0.0 }
    }
}

impl LossSpec {
    /// The long-run share of packets lost.
    pub fn mean(&self) -> f64 {
        match *self {
            LossSpec::Bernoulli { p } => p,
            LossSpec::Gilbert { p, r, bad, good } => {
                if p + r == 0.0 {
                    good
                } else {
                    let pi_bad = p / (p + r);
                    pi_bad * bad + (1.0 - pi_bad) * good
                }
            }
        }
    }

    /// Parses `--loss-model` (`bernoulli`, `gilbert:p=P,r=R[,bad=B][,good=G]` or
    /// `gilbert:burst=L[,bad=B]`), with `mean` the `--loss` value that the `bernoulli` and `burst`
    /// forms need.
    pub fn parse(model: &str, mean: f64) -> Result<LossSpec> {
        let lower = model.trim().to_ascii_lowercase();
        if lower == "bernoulli" || lower == "random" {
            return Ok(LossSpec::Bernoulli { p: mean });
        }
        let Some(rest) = lower.strip_prefix("gilbert") else {
            return Err(WanError::param("loss model", model, "expected bernoulli or gilbert:..."));
        };
        let rest = rest.strip_prefix(':').unwrap_or(rest);
        let (mut p, mut r, mut bad, mut good, mut burst) = (None, None, 1.0, 0.0, None);
        for kv in rest.split(',').filter(|s| !s.is_empty()) {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(WanError::param("loss model", model, format!("{kv:?} is not key=value")));
            };
            let prob = || parse_probability(v);
            match k.trim() {
                "p" => p = Some(prob()?),
                "r" => r = Some(prob()?),
                "bad" => bad = prob()?,
                "good" => good = prob()?,
                "burst" => {
                    let b: f64 =
                        v.trim().parse().map_err(|_| WanError::param("loss model", model, "burst must be a number"))?;
                    if !(b >= 1.0 && b.is_finite()) {
                        return Err(WanError::param("loss model", model, "burst must be at least 1"));
                    }
                    burst = Some(b);
                }
                other => {
                    return Err(WanError::param(
                        "loss model",
                        model,
                        format!("unknown key {other:?} (use p, r, bad, good or burst)"),
                    ))
                }
            }
        }
        match (p, r, burst) {
            (Some(p), Some(r), None) => Ok(LossSpec::Gilbert { p, r, bad, good }),
            (None, None, Some(b)) => {
                Self::gilbert_from_mean(mean, b, bad).map_err(|reason| WanError::param("loss model", model, reason))
            }
            _ => Err(WanError::param("loss model", model, "give either p= and r=, or burst= with --loss")),
        }
    }

    /// The Gilbert model (no loss in the good state) with long-run loss `mean` and mean burst
    /// length `burst` packets.
    pub fn gilbert_from_mean(mean: f64, burst: f64, bad: f64) -> std::result::Result<LossSpec, String> {
        if mean <= 0.0 {
            return Ok(LossSpec::Gilbert { p: 0.0, r: 1.0, bad, good: 0.0 });
        }
        if mean >= bad {
            return Err(format!("a loss of {mean} needs bad > {mean}"));
        }
        let r = 1.0 / burst;
        // mean = bad * p / (p + r)  =>  p = mean * r / (bad - mean).
        let p = mean * r / (bad - mean);
        if p > 1.0 {
            return Err("this loss and burst length need P(good -> bad) > 1".into());
        }
        Ok(LossSpec::Gilbert { p, r, bad, good: 0.0 })
    }

    /// The same kind of model with a new long-run loss (the burst length of a Gilbert model kept).
    pub fn with_mean(&self, mean: f64) -> Result<LossSpec> {
        match *self {
            LossSpec::Bernoulli { .. } => Ok(LossSpec::Bernoulli { p: mean }),
            LossSpec::Gilbert { r, bad, .. } => {
                let burst = if r > 0.0 { 1.0 / r } else { 1.0 };
                Self::gilbert_from_mean(mean, burst, bad)
                    .map_err(|reason| WanError::param("loss", &mean.to_string(), reason))
            }
        }
    }

    pub fn describe(&self) -> String {
        match *self {
            LossSpec::Bernoulli { p } => format!("bernoulli p={p}"),
            LossSpec::Gilbert { p, r, bad, good } => {
                format!("gilbert p={p:.3e} r={r:.3} bad={bad} good={good} (mean {:.3e})", self.mean())
            }
        }
    }
}

/// What one direction does to packets.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PathParams {
    /// One-way delay added to each packet, in nanoseconds.
    pub delay_ns: u64,
    /// Each packet's delay is drawn uniformly from delay ± jitter (order is kept).
    pub jitter_ns: u64,
    pub loss: LossSpec,
}

/// The whole configuration of an emulated link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Indexed by [`Dir::index`].
    pub paths: [PathParams; 2],
    /// Bottleneck rate in bit/s, both directions; `None` is the speed of the veth.
    pub rate_bps: Option<u64>,
    /// Bottleneck queue in bytes; `None` picks [`Params::default_queue`].
    pub queue_bytes: Option<u64>,
    /// Share of the rate taken by generated cross traffic, in percent, each direction.
    pub background_pct: f64,
    /// Congestion control in the end namespaces; `None` keeps the kernel's default.
    pub cc: Option<Cc>,
    pub seed: u64,
    /// Hosts joined to the storage side, 1 to [`crate::topo::MAX_HOSTS`] (fixed at `up`).
    #[serde(default = "one_host")]
    pub hosts: u8,
}

fn one_host() -> u8 {
    1
}

impl Params {
    /// A link that adds nothing, with the given seed.
    pub fn new(seed: u64) -> Params {
        Params {
            paths: [PathParams::default(); 2],
            rate_bps: None,
            queue_bytes: None,
            background_pct: 0.0,
            cc: None,
            seed,
            hosts: 1,
        }
    }

    pub fn path(&self, d: Dir) -> &PathParams {
        &self.paths[d.index()]
    }

    /// 50 ms worth of the rate, and at least 64 KiB.
    pub fn default_queue(rate_bps: u64) -> u64 {
        (rate_bps / 8 / 20).max(64 * 1024)
    }

    /// The `tbf` queue limit in bytes, if there is a rate.
    pub fn effective_queue(&self) -> Option<u64> {
        self.rate_bps.map(|r| self.queue_bytes.unwrap_or_else(|| Self::default_queue(r)))
    }

    /// The `tbf` burst: 1 ms worth of the rate (about 1 MB at 10 Gbit/s), at least 16 KiB.
    pub fn tbf_burst(rate_bps: u64) -> u64 {
        (rate_bps / 8 / 1000).max(16 * 1024)
    }

    /// Applies an update, checking the result as a whole; on error `self` is unchanged.
    pub fn apply(&mut self, u: &Update) -> Result<()> {
        let mut next = self.clone();
        for d in Dir::ALL {
            if !u.directions.includes(d) {
                continue;
            }
            let path = &mut next.paths[d.index()];
            if let Some(v) = u.delay_ns {
                path.delay_ns = v;
            }
            if let Some(v) = u.jitter_ns {
                path.jitter_ns = v;
            }
            match (&u.loss_model, u.loss) {
                (Some(m), p) => path.loss = LossSpec::parse(m, p.unwrap_or(path.loss.mean()))?,
                (None, Some(p)) => path.loss = path.loss.with_mean(p)?,
                (None, None) => {}
            }
        }
        if let Some(r) = u.rate_bps {
            next.rate_bps = r;
        }
        if let Some(q) = u.queue_bytes {
            next.queue_bytes = q;
        }
        if let Some(b) = u.background_pct {
            next.background_pct = b;
        }
        if let Some(cc) = u.cc {
            next.cc = Some(cc);
        }
        if let Some(s) = u.seed {
            next.seed = s;
        }
        next.validate()?;
        *self = next;
        Ok(())
    }

    /// Checks the combination of parameters.
    pub fn validate(&self) -> Result<()> {
        if !(1..=crate::topo::MAX_HOSTS).contains(&self.hosts) {
            return Err(WanError::param("hosts", &self.hosts.to_string(), "between 1 and 8"));
        }
        for path in &self.paths {
            if path.delay_ns > MAX_DELAY_NS || path.jitter_ns > MAX_DELAY_NS {
                return Err(WanError::param("delay", &format!("{} ns", path.delay_ns), "at most 10 s"));
            }
            let probs: &[f64] = match &path.loss {
                LossSpec::Bernoulli { p } => &[*p],
                LossSpec::Gilbert { p, r, bad, good } => &[*p, *r, *bad, *good],
            };
            if probs.iter().any(|p| !(0.0..=1.0).contains(p)) {
                return Err(WanError::param("loss", &path.loss.describe(), "probabilities lie in [0, 1]"));
            }
        }
        if let Some(r) = self.rate_bps {
            if !(MIN_RATE_BPS..=MAX_RATE_BPS).contains(&r) {
                return Err(WanError::param("rate", &format!("{r} bit/s"), "between 8 kbit and 100 gbit"));
            }
        }
        if let Some(q) = self.queue_bytes {
            if !(1500..=1 << 30).contains(&q) {
                return Err(WanError::param("queue", &format!("{q} bytes"), "between 1500 B and 1 GiB"));
            }
        }
        if !(0.0..100.0).contains(&self.background_pct) {
            return Err(WanError::param("background load", &format!("{}%", self.background_pct), "in [0, 100)"));
        }
        if self.background_pct > 0.0 && self.rate_bps.is_none() {
            return Err(WanError::param(
                "background load",
                &format!("{}%", self.background_pct),
                "needs --rate (the load is a share of the link rate)",
            ));
        }
        Ok(())
    }
}

/// A change of parameters (`stics wan up` starts from [`Params::new`] and applies one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Update {
    pub directions: Directions,
    pub delay_ns: Option<u64>,
    pub jitter_ns: Option<u64>,
    /// Long-run loss probability.
    pub loss: Option<f64>,
    /// Loss model text, parsed against the loss in force (see [`LossSpec::parse`]).
    pub loss_model: Option<String>,
    /// `Some(None)` removes the rate limit.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub rate_bps: Option<Option<u64>>,
    /// `Some(None)` goes back to the default queue.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub queue_bytes: Option<Option<u64>>,
    pub background_pct: Option<f64>,
    pub cc: Option<Cc>,
    pub seed: Option<u64>,
}

/// A field that is present (even as `null`) is a change; an absent one keeps the value.
#[expect(clippy::option_option, reason = "absent, null and a value are three different requests")]
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

/// Parses a duration such as `5ms`, `250us`, `1.5ms`, `0.2s`, `0` into nanoseconds (units as
/// every stics subcommand reads them, see `stics_units`), at most 10 s.
pub fn parse_duration(s: &str) -> Result<u64> {
    let ns = (stics_units::parse_duration(s)? * 1e9).round();
    if ns > MAX_DELAY_NS as f64 {
        return Err(WanError::param("duration", s, "at most 10 s"));
    }
    Ok(ns as u64)
}

/// Parses a rate such as `100mbit`, `1gbit`, `10Gbit/s`, `512kbit` (decimal prefixes) or
/// `12.5MB/s` into bit/s, between 8 kbit and 100 gbit.
pub fn parse_rate(s: &str) -> Result<u64> {
    let bps = stics_units::parse_rate(s)?.round();
    if !(MIN_RATE_BPS as f64..=MAX_RATE_BPS as f64).contains(&bps) {
        return Err(WanError::param("rate", s, "between 8 kbit and 100 gbit"));
    }
    Ok(bps as u64)
}

/// The largest queue a direction may be given, in bytes.
pub const MAX_QUEUE_BYTES: u64 = 1 << 40;

/// Parses a probability such as `1e-2`, `0.01` or `1%`.
pub fn parse_probability(s: &str) -> Result<f64> {
    Ok(stics_units::parse_probability(s)?)
}

/// Parses a background load such as `30%` or `30` into percent.
pub fn parse_load(s: &str) -> Result<f64> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t);
    let v: f64 = t.trim().parse().map_err(|_| WanError::param("background load", s, "not a number"))?;
    if !(0.0..100.0).contains(&v) {
        return Err(WanError::param("background load", s, "in [0, 100) percent"));
    }
    Ok(v)
}

/// Formats nanoseconds for people (`5ms`, `250us`).
pub fn fmt_duration(ns: u64) -> String {
    if ns == 0 {
        "0".into()
    } else if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns >= 1_000_000 {
        format!("{:.3}ms", ns as f64 / 1e6)
    } else {
        format!("{}us", ns as f64 / 1e3)
    }
}

/// Formats bit/s for people and for `tc` (`100mbit`).
pub fn fmt_rate(bps: u64) -> String {
    if bps.is_multiple_of(1_000_000_000) {
        format!("{}gbit", bps / 1_000_000_000)
    } else if bps.is_multiple_of(1_000_000) {
        format!("{}mbit", bps / 1_000_000)
    } else if bps.is_multiple_of(1000) {
        format!("{}kbit", bps / 1000)
    } else {
        format!("{bps}bit")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("5ms").unwrap(), 5_000_000);
        assert_eq!(parse_duration("1.5ms").unwrap(), 1_500_000);
        assert_eq!(parse_duration("250us").unwrap(), 250_000);
        assert_eq!(parse_duration("0.2s").unwrap(), 200_000_000);
        assert_eq!(parse_duration("0").unwrap(), 0);
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-1ms").is_err());
        assert!(parse_duration("11s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn rates_use_decimal_prefixes() {
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("10Gbit/s").unwrap(), 10_000_000_000);
        assert_eq!(parse_rate("512kbit").unwrap(), 512_000);
        assert!(parse_rate("100").is_err());
        assert!(parse_rate("1bit").is_err());
        assert!(parse_rate("1tbit").is_err());
    }

    #[test]
    fn rates_also_read_bytes_per_second() {
        assert_eq!(parse_rate("12.5MB/s").unwrap(), 100_000_000);
        assert_eq!(parse_rate("100mbps").unwrap(), 100_000_000);
        assert!(parse_rate("100m").is_err(), "bits or bytes is said, not guessed");
    }

    #[test]
    fn probabilities_accept_exponents_and_percent() {
        assert_eq!(parse_probability("1e-2").unwrap(), 0.01);
        assert_eq!(parse_probability("1%").unwrap(), 0.01);
        assert_eq!(parse_probability("0").unwrap(), 0.0);
        assert!(parse_probability("1.5").is_err());
        assert!(parse_probability("x").is_err());
    }

    #[test]
    fn gilbert_burst_form_keeps_the_mean() {
        let m = LossSpec::parse("gilbert:burst=4", 0.01).unwrap();
        assert!((m.mean() - 0.01).abs() < 1e-12);
        let LossSpec::Gilbert { r, .. } = m else { panic!("not gilbert") };
        assert!((r - 0.25).abs() < 1e-12);
        let m2 = m.with_mean(0.001).unwrap();
        assert!((m2.mean() - 0.001).abs() < 1e-12);
    }

    #[test]
    fn gilbert_explicit_form_parses() {
        let m = LossSpec::parse("gilbert:p=0.01,r=0.3,bad=0.5,good=0.001", 0.0).unwrap();
        assert_eq!(m, LossSpec::Gilbert { p: 0.01, r: 0.3, bad: 0.5, good: 0.001 });
        assert!(LossSpec::parse("gilbert:p=0.01", 0.0).is_err());
        assert!(LossSpec::parse("gilbert:q=1", 0.0).is_err());
        assert!(LossSpec::parse("pareto", 0.0).is_err());
    }

    #[test]
    fn update_applies_to_chosen_directions_only() {
        let mut p = Params::new(1);
        let u = Update { directions: Directions::ToHost, delay_ns: Some(7), loss: Some(0.5), ..Default::default() };
        p.apply(&u).unwrap();
        assert_eq!(p.path(Dir::ToStorage).delay_ns, 0);
        assert_eq!(p.path(Dir::ToHost).delay_ns, 7);
        assert_eq!(p.path(Dir::ToHost).loss, LossSpec::Bernoulli { p: 0.5 });
    }

    #[test]
    fn invalid_update_leaves_params_unchanged() {
        let mut p = Params::new(1);
        let before = p.clone();
        let u = Update { delay_ns: Some(5), background_pct: Some(30.0), ..Default::default() };
        assert!(p.apply(&u).is_err(), "background without a rate is refused");
        assert_eq!(p, before);
    }

    #[test]
    fn clearing_the_rate_survives_json() {
        let u = Update { rate_bps: Some(None), ..Default::default() };
        let back: Update = serde_json::from_str(&serde_json::to_string(&u).unwrap()).unwrap();
        assert_eq!(back.rate_bps, Some(None));
        let keep: Update = serde_json::from_str(&serde_json::to_string(&Update::default()).unwrap()).unwrap();
        assert_eq!(keep.rate_bps, None);
    }

    #[test]
    fn default_queue_and_burst_scale_with_rate() {
        assert_eq!(Params::default_queue(100_000_000), 625_000);
        assert_eq!(Params::default_queue(1_000_000), 64 * 1024);
        assert_eq!(Params::tbf_burst(10_000_000_000), 1_250_000);
        assert_eq!(Params::tbf_burst(100_000_000), 16 * 1024);
    }

    #[test]
    fn formatting_round_trips() {
        for s in ["5ms", "250us", "0"] {
            assert_eq!(fmt_duration(parse_duration(s).unwrap()), s);
        }
        for s in ["100mbit", "10gbit", "512kbit"] {
            assert_eq!(fmt_rate(parse_rate(s).unwrap()), s);
        }
    }
}
