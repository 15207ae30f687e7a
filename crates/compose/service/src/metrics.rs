//! The metrics of a running service in OpenMetrics text: the target's counts (sessions, commands
//! by kind, their latency, data bytes in and out; per target and LUN) and, for each cached LUN,
//! its cache's status, labelled with the target and LUN that serve it; for each SG journal (a
//! `journal(...)` LUN), its groups, fill and apply lag.
//!
//! Both are prometheus-client collectors registered once; a scrape reads the live atomics and
//! statuses and encodes them, so nothing is kept twice and nothing registered per scrape. The
//! gateway's host-visible read, write and flush latency is the target's command latency of its
//! LUNs: measured around the device's execution of each command, the cache's included.

use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use stics_cache::{GroupStatus, Status};
use stics_journal::tokens::TokenStatus;
use stics_journal::{JournalDev, JournalStatus};
use stics_target::stats::{HistogramSnapshot, Kind};
use stics_target::Stats;

use crate::service::ServedCache;

/// A registry with the target's, the caches' and the SG journals' collectors.
pub fn registry(stats: Arc<Stats>, caches: Vec<ServedCache>, journals: Vec<Arc<JournalDev>>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(TargetCollector(stats)));
    if !caches.is_empty() {
        r.register_collector(Box::new(CacheCollector(caches)));
    }
    if !journals.is_empty() {
        r.register_collector(Box::new(JournalCollector(journals)));
    }
    r
}

/// The SG journals served, in the order they were opened (the `journal` label).
#[derive(Debug)]
struct JournalCollector(Vec<Arc<JournalDev>>);

type JournalRead = fn(&JournalStatus) -> u64;
type JournalGauge = (&'static str, &'static str, fn(&JournalStatus) -> f64);

const JOURNAL_COUNTERS: [(&str, &str, JournalRead); 8] = [
    ("groups_committed", "Groups the journal took, durable before the answer", |s| s.groups_committed),
    ("group_bytes", "Bytes of those groups as shipped", |s| s.group_bytes),
    ("group_raw_bytes", "Bytes of data those groups carry", |s| s.group_raw_bytes),
    ("groups_again", "Groups sent again after a lost answer, taken without effect", |s| s.groups_again),
    ("groups_applied", "Groups applied to the medium", |s| s.groups_applied),
    ("apply_failures", "Times applying a group to the medium failed (it is tried again)", |s| s.apply_failures),
    ("blocks_read_journal", "Blocks reads took from groups not on the medium yet", |s| s.blocks_read_journal),
    ("blocks_read_medium", "Blocks reads took from the medium", |s| s.blocks_read_medium),
];

impl prometheus_client::collector::Collector for JournalCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let statuses: Vec<(String, JournalStatus)> =
            self.0.iter().enumerate().map(|(i, j)| (i.to_string(), j.status())).collect();
        let labels: Vec<[(&'static str, &str); 1]> = statuses.iter().map(|(i, _)| [("journal", i.as_str())]).collect();
        for (name, help, read) in JOURNAL_COUNTERS {
            let rows: Vec<(&Labels<'_>, u64)> =
                labels.iter().zip(&statuses).map(|(l, (_, s))| (&l[..], read(s))).collect();
            counter(&mut enc, &format!("stics_sg_{name}"), help, &rows)?;
        }
        let gauges: [JournalGauge; 4] = [
            ("groups_unapplied", "Groups committed and not on the medium yet", |s| s.groups_unapplied as f64),
            ("journal_used_bytes", "Journal bytes in use", |s| s.journal_used as f64),
            ("journal_bytes", "The journal's size", |s| s.journal_bytes as f64),
            ("apply_lag_seconds", "Age of the oldest group not on the medium yet", |s| s.apply_lag_secs),
        ];
        for (name, help, read) in gauges {
            let rows: Vec<(&Labels<'_>, f64)> =
                labels.iter().zip(&statuses).map(|(l, (_, s))| (&l[..], read(s))).collect();
            gauge(&mut enc, &format!("stics_sg_{name}"), help, &rows)?;
        }
        let tokens: Vec<TokenStatus> = self.0.iter().map(|j| j.token_status()).collect();
        let token_counters: [(&str, &str, TokenRead); 9] = [
            ("token_grants", "Coherence tokens granted to gateways", |t| t.grants),
            ("token_revokes", "Coherence tokens the SG asked a gateway to give up", |t| t.revokes),
            ("token_releases", "Coherence tokens gateways gave up", |t| t.releases),
            (
                "token_early_releases",
                "Releases that took effect once the journal held the holder's writes, before the holder's answer",
                |t| t.early_releases,
            ),
            ("token_breaks", "Coherence tokens taken from gateways that did not answer", |t| t.breaks),
            ("token_revokes_answered", "Revokes a holder's release answered", |t| t.revokes_answered),
            (
                "token_revokes_queued",
                "Revokes queued for their holder once the token table's record was durable",
                |t| t.revokes_queued,
            ),
            ("token_revokes_polled", "Revokes a poll of their holder carried", |t| t.revokes_polled),
            (
                "token_grant_data_blocks",
                "Blocks sent with shared grants to the gateways that wanted them (each a round trip saved)",
                |t| t.grant_data_blocks,
            ),
        ];
        let token_seconds: [TokenValue; 3] = [
            ("token_revoke_answer_seconds", "Seconds from revokes to the releases that answered them", |t| {
                t.revoke_answer_secs
            }),
            ("token_revoke_durable_seconds", "Seconds revokes waited for the token table's record", |t| {
                t.revoke_durable_secs
            }),
            ("token_revoke_poll_seconds", "Seconds queued revokes waited for a poll of their holder", |t| {
                t.revoke_poll_secs
            }),
        ];
        for (name, help, read) in token_seconds {
            let rows: Vec<(&Labels<'_>, f64)> = labels.iter().zip(&tokens).map(|(l, t)| (&l[..], read(t))).collect();
            counter(&mut enc, &format!("stics_sg_{name}"), help, &rows)?;
        }
        for (name, help, read) in token_counters {
            let rows: Vec<(&Labels<'_>, u64)> = labels.iter().zip(&tokens).map(|(l, t)| (&l[..], read(t))).collect();
            counter(&mut enc, &format!("stics_sg_{name}"), help, &rows)?;
        }
        let kinds: Vec<[(&'static str, &str); 2]> = statuses
            .iter()
            .flat_map(|(i, _)| {
                [[("journal", i.as_str()), ("kind", "shared")], [("journal", i.as_str()), ("kind", "exclusive")]]
            })
            .collect();
        let held: Vec<f64> = tokens.iter().flat_map(|t| [t.held_shared as f64, t.held_exclusive as f64]).collect();
        let rows: Vec<(&Labels<'_>, f64)> = kinds.iter().zip(held).map(|(l, v)| (&l[..], v)).collect();
        gauge(&mut enc, "stics_sg_tokens_held", "Coherence tokens gateways hold, by kind", &rows)?;
        let token_gauges: [TokenValue; 2] = [
            ("token_gateways", "Gateways that exchanged tokens for the LUN", |t| t.gateways as f64),
            ("segments_blocked", "Segments a gateway waits for while their holder has not given them up", |t| {
                t.blocked.len() as f64
            }),
        ];
        for (name, help, read) in token_gauges {
            let rows: Vec<(&Labels<'_>, f64)> = labels.iter().zip(&tokens).map(|(l, t)| (&l[..], read(t))).collect();
            gauge(&mut enc, &format!("stics_sg_{name}"), help, &rows)?;
        }
        Ok(())
    }
}

type TokenRead = fn(&TokenStatus) -> u64;
/// A token status value, as a counter or a gauge: its name, its help and how to read it.
type TokenValue = (&'static str, &'static str, fn(&TokenStatus) -> f64);

/// Encodes `registry` as OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        out = format!("# cannot encode metrics: {e}\n");
    }
    out
}

/// OpenMetrics text in Prometheus' classic text format (version 0.0.4): a counter's family is
/// named as its samples are (`_total`), `unknown` is `untyped`, and `# UNIT` and `# EOF` go.
pub fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE, which decides the family's name.
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(h) = help.replace(rest) {
                out.push_str(&format!("# HELP {h}\n"));
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), kind),
                "unknown" => (name.to_owned(), "untyped"),
                _ => (name.to_owned(), kind),
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str(&format!("# HELP {h}\n"));
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

type Labels<'a> = [(&'static str, &'a str)];

/// A counter family, one value per label set; left out when it has none.
fn counter<V: prometheus_client::encoding::EncodeCounterValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(&Labels<'_>, V)],
) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            family.encode_counter::<NoLabelSet, _, u64>(v, None)?;
        } else {
            family.encode_family(labels)?.encode_counter::<NoLabelSet, _, u64>(v, None)?;
        }
    }
    Ok(())
}

/// A gauge family, one value per label set; left out when it has none.
fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, rows: &[(&Labels<'_>, f64)]) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            family.encode_gauge(v)?;
        } else {
            family.encode_family(labels)?.encode_gauge(v)?;
        }
    }
    Ok(())
}

/// The target's counts.
#[derive(Debug)]
struct TargetCollector(Arc<Stats>);

impl prometheus_client::collector::Collector for TargetCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let stats = &self.0;
        let targets = stats.targets();
        let names: Vec<[(&'static str, &str); 1]> = targets.iter().map(|t| [("target", t.iqn())]).collect();
        let rows: Vec<(&Labels<'_>, f64)> =
            targets.iter().zip(&names).map(|(t, l)| (&l[..], t.sessions() as f64)).collect();
        gauge(&mut enc, "stics_target_sessions", "Sessions in full feature phase", &rows)?;
        let rows: Vec<(&Labels<'_>, u64)> = targets.iter().zip(&names).map(|(t, l)| (&l[..], t.logins())).collect();
        counter(&mut enc, "stics_target_logins", "Sessions that logged in", &rows)?;
        gauge(
            &mut enc,
            "stics_target_discovery_sessions",
            "Discovery sessions",
            &[(&[], stats.discovery_sessions() as f64)],
        )?;
        counter(
            &mut enc,
            "stics_target_refused_logins",
            "Logins refused (authentication, initiator not allowed, unknown target, no session slot)",
            &[(&[], stats.refused_logins())],
        )?;

        // Per LUN: the numbers as text once, then one label set per LUN and per LUN and kind.
        let luns: Vec<(&str, String, &stics_target::stats::LunStats)> = targets
            .iter()
            .flat_map(|t| t.luns().iter().enumerate().map(move |(i, l)| (t.iqn(), i.to_string(), l)))
            .collect();
        let per_lun: Vec<[(&'static str, &str); 2]> =
            luns.iter().map(|(iqn, lun, _)| [("target", *iqn), ("lun", lun.as_str())]).collect();
        let rows: Vec<(&Labels<'_>, u64)> =
            luns.iter().zip(&per_lun).map(|((_, _, l), labels)| (&labels[..], l.bytes_in())).collect();
        counter(&mut enc, "stics_target_received_bytes", "Write data bytes received from initiators", &rows)?;
        let rows: Vec<(&Labels<'_>, u64)> =
            luns.iter().zip(&per_lun).map(|((_, _, l), labels)| (&labels[..], l.bytes_out())).collect();
        counter(&mut enc, "stics_target_sent_bytes", "Read data bytes sent to initiators", &rows)?;

        // Kinds a LUN never saw are left out: a target with many idle LUNs stays a short page.
        let mut per_kind = Vec::new();
        for (iqn, lun, l) in &luns {
            for kind in Kind::ALL {
                if l.commands(kind) > 0 {
                    per_kind.push(([("target", *iqn), ("lun", lun.as_str()), ("kind", kind.name())], kind, *l));
                }
            }
        }
        let rows: Vec<(&Labels<'_>, u64)> =
            per_kind.iter().map(|(labels, kind, l)| (&labels[..], l.commands(*kind))).collect();
        counter(&mut enc, "stics_target_commands", "SCSI commands by kind", &rows)?;
        let rows: Vec<(&Labels<'_>, u64)> =
            per_kind.iter().map(|(labels, kind, l)| (&labels[..], l.failed(*kind))).collect();
        counter(
            &mut enc,
            "stics_target_failed_commands",
            "SCSI commands that ended with a status other than GOOD",
            &rows,
        )?;
        if per_kind.is_empty() {
            return Ok(());
        }
        let mut family = enc.encode_descriptor(
            "stics_target_command_latency_seconds",
            "From a command's start on its LUN (all its data in) to its response",
            None,
            MetricType::Histogram,
        )?;
        for (labels, kind, l) in &per_kind {
            let HistogramSnapshot { sum, count, buckets } = l.latency(*kind);
            family.encode_family(&&labels[..])?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        Ok(())
    }
}

/// The caches' statuses.
#[derive(Debug)]
struct CacheCollector(Vec<ServedCache>);

/// A gauge or a counter of the cache's status.
enum Value {
    Gauge(fn(&Status) -> f64),
    Counter(fn(&Status) -> u64),
}

/// The cache's series: name (after `stics_cache_`), help and how to read it from a status.
const CACHE_SERIES: &[(&str, &str, Value)] = &[
    ("dirty_bytes", "Bytes not yet on the remote", Value::Gauge(|s| s.dirty_bytes as f64)),
    ("log_fill_ratio", "Fraction of the write log in use", Value::Gauge(|s| s.log_fill)),
    ("log_bytes", "Bytes of the write log's ring", Value::Gauge(|s| s.log_bytes as f64)),
    ("ram_bytes", "Host write bytes in RAM waiting for the log", Value::Gauge(|s| s.ram_bytes as f64)),
    ("epoch", "The open epoch", Value::Gauge(|s| s.epoch as f64)),
    ("destaged_epoch", "The newest epoch fully on the remote", Value::Gauge(|s| s.destaged_epoch as f64)),
    (
        "destage_rate_bytes_per_second",
        "Destage throughput over the last seconds",
        Value::Gauge(|s| s.destage_bytes_per_sec),
    ),
    ("destage_lag_seconds", "Age of the oldest write not yet on the remote", Value::Gauge(|s| s.destage_lag_secs)),
    ("remote_write_seconds", "Moving average of a remote write's service time", Value::Gauge(|s| s.remote_write_secs)),
    (
        "remote_rtt_seconds",
        "Moving average of a remote SYNCHRONIZE CACHE (about one round trip)",
        Value::Gauge(|s| s.remote_sync_secs),
    ),
    (
        "read_hit_ratio",
        "Fraction of read blocks served from RAM, the log or the read cache",
        Value::Gauge(|s| ratio(s.read_blocks_cache, s.read_blocks_cache + s.read_blocks_remote)),
    ),
    (
        "read_cache_hit_ratio",
        "Fraction of read cache lookups that hit",
        Value::Gauge(|s| ratio(s.read_cache_hits, s.read_cache_hits + s.read_cache_misses)),
    ),
    (
        "health_state",
        "0 healthy, 1 degraded (retrying with backoff), 2 stalled (a lasting failure)",
        Value::Gauge(|s| match s.health.state {
            stics_cache::core::State::Healthy => 0.0,
            stics_cache::core::State::Degraded => 1.0,
            stics_cache::core::State::Stalled => 2.0,
        }),
    ),
    ("failing_seconds", "How long the failure in force has lasted", Value::Gauge(|s| s.health.since_secs)),
    ("index_extents", "Runs of blocks in the dirty index", Value::Gauge(|s| s.index_extents as f64)),
    ("host_write_bytes", "Bytes the host wrote", Value::Counter(|s| s.host_write_bytes)),
    ("remote_write_bytes", "Bytes written to the remote", Value::Counter(|s| s.remote_write_bytes)),
    ("absorbed_blocks", "Host write blocks absorbed before destage", Value::Counter(|s| s.blocks_absorbed)),
    ("destaged_blocks", "Blocks written to the remote by destage", Value::Counter(|s| s.blocks_destaged)),
    ("records", "Log records written (group commits)", Value::Counter(|s| s.records)),
    ("read_cache_blocks", "Read blocks served from RAM or the log", Value::Counter(|s| s.read_blocks_cache)),
    ("read_remote_blocks", "Read blocks fetched from the remote", Value::Counter(|s| s.read_blocks_remote)),
    ("read_cache_hits", "Read cache lookups that hit", Value::Counter(|s| s.read_cache_hits)),
    ("read_cache_misses", "Read cache lookups that missed", Value::Counter(|s| s.read_cache_misses)),
    ("destage_retries", "Remote writes or flushes retried", Value::Counter(|s| s.destage_retries)),
    ("throttled_writes", "Host writes slowed by a filling log", Value::Counter(|s| s.throttled_writes)),
    (
        "refused_writes",
        "Host writes ended because the log was full past the full timeout",
        Value::Counter(|s| s.refused_writes),
    ),
    (
        "resent_epochs",
        "Epochs sent again whole after a failure or a reset of the remote",
        Value::Counter(|s| s.epochs_resent),
    ),
];

/// How a counter of [`GROUP_SERIES`] is read from a cache's group status.
type GroupCount = fn(&GroupStatus) -> u64;

/// How a counter of a shared LUN's tokens is read.
type TokenCount = fn(&stics_coherence::driver::TokenStats) -> u64;

/// The counters of what a cache shipped to a stics SG, as [`CACHE_SERIES`].
const GROUP_SERIES: &[(&str, &str, GroupCount)] = &[
    ("sg_groups", "Groups of epochs the stics SG took", |g| g.groups),
    ("sg_group_epochs", "Epochs in those groups", |g| g.epochs),
    ("sg_bytes_before_merge", "Bytes of the groups' epochs before merging", |g| g.bytes_before_merge),
    ("sg_bytes_merged", "Bytes of the groups' data after merging", |g| g.bytes_merged),
    ("sg_bytes_shipped", "Bytes of the groups as shipped (compressed, with tables)", |g| g.bytes_shipped),
    ("sg_groups_resent", "Groups sent again after a failure", |g| g.resent),
    ("sg_groups_overlapped", "Groups sent while the one before was still out (a settle waited)", |g| g.overlapped),
    ("sg_plain_epochs", "Epochs too large for a group, sent as plain writes", |g| g.plain_epochs),
];

fn ratio(hit: u64, all: u64) -> f64 {
    if all == 0 {
        0.0
    } else {
        hit as f64 / all as f64
    }
}

impl prometheus_client::collector::Collector for CacheCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let statuses: Vec<(String, Status)> = self.0.iter().map(|c| (c.lun.to_string(), c.cache.status())).collect();
        let labels: Vec<[(&'static str, &str); 3]> = self
            .0
            .iter()
            .zip(&statuses)
            .map(|(c, (lun, s))| [("target", c.target.as_str()), ("lun", lun.as_str()), ("mode", s.mode.as_str())])
            .collect();
        for (name, help, value) in CACHE_SERIES {
            let name = format!("stics_cache_{name}");
            match value {
                Value::Gauge(read) => {
                    let rows: Vec<(&Labels<'_>, f64)> =
                        labels.iter().zip(&statuses).map(|(l, (_, s))| (&l[..], read(s))).collect();
                    gauge(&mut enc, &name, help, &rows)?;
                }
                Value::Counter(read) => {
                    let rows: Vec<(&Labels<'_>, u64)> =
                        labels.iter().zip(&statuses).map(|(l, (_, s))| (&l[..], read(s))).collect();
                    counter(&mut enc, &name, help, &rows)?;
                }
            }
        }
        let errors: Vec<([(&'static str, &str); 4], u64)> = labels
            .iter()
            .zip(&statuses)
            .flat_map(|(l, (_, s))| {
                s.errors_by_kind.iter().map(move |(kind, n)| ([l[0], l[1], l[2], ("kind", *kind)], *n))
            })
            .collect();
        let rows: Vec<(&Labels<'_>, u64)> = errors.iter().map(|(l, n)| (&l[..], *n)).collect();
        counter(&mut enc, "stics_cache_errors", "Failures of the remote or the log, by kind", &rows)?;
        // What the caches in front of a stics SG shipped: only those LUNs have the series.
        let groups: Vec<(&Labels<'_>, &GroupStatus)> =
            labels.iter().zip(&statuses).filter_map(|(l, (_, s))| s.groups.as_ref().map(|g| (&l[..], g))).collect();
        for (name, help, read) in GROUP_SERIES {
            let rows: Vec<(&Labels<'_>, u64)> = groups.iter().map(|(l, g)| (*l, read(g))).collect();
            counter(&mut enc, &format!("stics_cache_{name}"), help, &rows)?;
        }
        let rows: Vec<(&Labels<'_>, f64)> = groups.iter().map(|(l, g)| (*l, g.ship_bytes_per_sec)).collect();
        gauge(&mut enc, "stics_cache_sg_ship_rate_bytes_per_second", "Rate groups were shipped at, smoothed", &rows)?;
        // A shared LUN's tokens: only those LUNs have the series.
        let tokens: Vec<(&[(&'static str, &str); 3], stics_coherence::driver::TokenStats)> =
            labels.iter().zip(&self.0).filter_map(|(l, c)| c.shared.as_ref().map(|s| (l, s.token_stats()))).collect();
        let held: Vec<([(&'static str, &str); 4], f64)> = tokens
            .iter()
            .flat_map(|(l, t)| {
                [
                    ([l[0], l[1], l[2], ("kind", "shared")], t.held_shared as f64),
                    ([l[0], l[1], l[2], ("kind", "exclusive")], t.held_exclusive as f64),
                ]
            })
            .collect();
        let rows: Vec<(&Labels<'_>, f64)> = held.iter().map(|(l, n)| (&l[..], *n)).collect();
        gauge(&mut enc, "stics_cache_tokens_held", "Tokens of a shared LUN this gateway holds, by kind", &rows)?;
        let series: [(&str, &str, TokenCount); 4] = [
            ("stics_cache_token_waits", "Commands that waited for a token", |t| t.waits),
            (
                "stics_cache_token_surrenders",
                "Tokens given up: another gateway asked, or the gateway held more than its bound",
                |t| t.surrenders,
            ),
            ("stics_cache_tokens_broken", "Tokens the SG took away from this gateway", |t| t.broken),
            (
                "stics_cache_token_grants_with_data",
                "Shared grants that came with the blocks their read waited for (a round trip saved each)",
                |t| t.grants_with_data,
            ),
        ];
        for (name, help, read) in series {
            let rows: Vec<(&Labels<'_>, u64)> = tokens.iter().map(|(l, t)| (&l[..], read(t))).collect();
            counter(&mut enc, name, help, &rows)?;
        }
        let rows: Vec<(&Labels<'_>, f64)> = tokens.iter().map(|(l, t)| (&l[..], t.wait_secs)).collect();
        gauge(
            &mut enc,
            "stics_cache_token_wait_seconds",
            "Seconds commands waited for tokens, in all (it only grows)",
            &rows,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classic_format_names_counter_families_as_their_samples() {
        let open = "# HELP a_bytes Bytes.\n# TYPE a_bytes counter\na_bytes_total{lun=\"0\"} 3\n\
                    # HELP b Gauge.\n# TYPE b gauge\nb 1\n# EOF\n";
        let want = "# HELP a_bytes_total Bytes.\n# TYPE a_bytes_total counter\na_bytes_total{lun=\"0\"} 3\n\
                    # HELP b Gauge.\n# TYPE b gauge\nb 1\n";
        assert_eq!(classic(open), want);
    }

    #[test]
    fn ratios_of_nothing_are_zero() {
        assert!(ratio(0, 0).abs() < f64::EPSILON);
        assert!((ratio(3, 4) - 0.75).abs() < f64::EPSILON);
    }

    #[test]
    fn counter_names_leave_the_total_suffix_to_the_encoder() {
        for (name, _, value) in CACHE_SERIES {
            if matches!(value, Value::Counter(_)) {
                assert!(!name.ends_with("_total"), "{name}");
            }
        }
    }
}
