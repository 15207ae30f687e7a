//! Who sees and who reaches which target of a running `stics target`, with real peers: libiscsi's
//! `iscsi-ls` (a SendTargets discovery session) and `iscsi-inq` (a normal login), and the test
//! kit's raw client for exact login statuses. A target's `initiators` hide it from, and refuse it
//! to, every other initiator; a CHAP target is listed only to a discovery session that passed
//! `[discovery]` CHAP, and a wrong discovery secret is refused.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use stics_testkit::client::Client;
use stics_testkit::peers::{SticsOptions, SticsTarget};
use stics_wire::pdu::{login_status, Header, Pdu, TextRequest, RESERVED_TAG};
use stics_wire::text;

const OPEN: &str = "iqn.2024-01.org.stics.test:open";
const ACL: &str = "iqn.2024-01.org.stics.test:acl";
const CHAP: &str = "iqn.2024-01.org.stics.test:chap";
const FRIEND: &str = "iqn.2024-01.org.stics.test:friend";
const STRANGER: &str = "iqn.2024-01.org.stics.test:stranger";
const TARGET_SECRET: &str = "chap-target-secret-1";
const DISCOVERY_SECRET: &str = "discovery-secret-2";

/// Three targets: one for anyone, one for [`FRIEND`] only, one behind CHAP as `alice`.
fn targets_toml() -> String {
    format!(
        "[[target]]\niqn = \"{OPEN}\"\nluns = [\"mem:1MiB\"]\n\
         [[target]]\niqn = \"{ACL}\"\nluns = [\"mem:1MiB\"]\ninitiators = [\"{FRIEND}\"]\n\
         [[target]]\niqn = \"{CHAP}\"\nluns = [\"mem:1MiB\"]\nchap = {{ user = \"alice\", secret = \"{TARGET_SECRET}\" }}\n"
    )
}

/// Writes `toml` to `dir/name` and returns the path.
fn write_config(dir: &Path, name: &str, toml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path
}

/// `stics target --config FILE` plus `extra`, logging into `log`, with `env`.
fn start(config: &Path, extra: &[&str], log: &Path, env: &[(&str, &str)]) -> SticsTarget {
    let mut args = vec!["--config".to_owned(), config.display().to_string()];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    env.push(("RUST_LOG".into(), "debug".into()));
    SticsTarget::start(
        Path::new(env!("CARGO_BIN_EXE_stics")),
        SticsOptions { iqn: None, args, env, stderr: Some(log.to_owned()) },
    )
}

/// `user%secret@` for a URL, or nothing.
fn userinfo(chap: Option<(&str, &str)>) -> String {
    chap.map(|(u, s)| format!("{u}%{s}@")).unwrap_or_default()
}

/// The target names `iscsi-ls` discovers as `initiator`, or its stderr if the discovery login
/// failed.
fn ls(port: u16, initiator: &str, chap: Option<(&str, &str)>) -> Result<BTreeSet<String>, String> {
    let out = Command::new("iscsi-ls")
        .args(["-i", initiator])
        .arg(format!("iscsi://{}127.0.0.1:{port}", userinfo(chap)))
        .output()
        .expect("run iscsi-ls (libiscsi-bin)");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(stdout
        .lines()
        .filter_map(|l| l.strip_prefix("Target:"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// Logs in to LUN 0 of `target` as `initiator` with `iscsi-inq`; Err holds its stderr.
fn inq(port: u16, target: &str, initiator: &str, chap: Option<(&str, &str)>) -> Result<(), String> {
    let out = Command::new("iscsi-inq")
        .args(["-i", initiator])
        .arg(format!("iscsi://{}127.0.0.1:{port}/{target}/0", userinfo(chap)))
        .output()
        .expect("run iscsi-inq (libiscsi-bin)");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn addr(t: &SticsTarget) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], t.port))
}

/// The status class and detail of one login request with `keys` (CSG to NSG, transit set).
async fn login_status_of(addr: SocketAddr, csg: u8, nsg: u8, keys: &[(&str, &str)]) -> (u8, u8) {
    let mut c = Client::connect(addr).await;
    let kv: Vec<(&str, String)> = keys.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    let (r, _) = c.login_step(csg, nsg, true, &kv).await;
    (r.status_class, r.status_detail)
}

/// Opens an unauthenticated discovery session as `initiator` and asks `SendTargets=value`;
/// returns the TargetName values of the answer.
async fn send_targets(addr: SocketAddr, initiator: &str, value: &str) -> Vec<String> {
    let mut c = Client::connect(addr).await;
    let kv = [("InitiatorName", initiator.to_owned()), ("SessionType", "Discovery".to_owned())];
    let (r, _) = c.login_step(1, 3, true, &kv).await;
    assert_eq!((r.status_class, r.status_detail), login_status::SUCCESS, "discovery login as {initiator}");
    let itt = c.next_itt();
    let req = TextRequest {
        final_: true,
        itt,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: r.stat_sn.wrapping_add(1),
        ..Default::default()
    };
    c.send(Pdu::new(req, text::encode(&[("SendTargets", value)]))).await;
    let p = c.recv().await;
    let Header::TextResponse(h) = p.header else { panic!("expected a text response, got {:?}", p.header) };
    assert!(h.final_ && h.itt == itt);
    text::parse(&p.data).unwrap().into_iter().filter(|(k, _)| k == "TargetName").map(|(_, v)| v).collect()
}

#[test]
fn initiator_lists_hide_and_refuse_targets_and_open_discovery_lists_no_chap_target() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "target.toml", &targets_toml());
    let t = start(&config, &[], &dir.path().join("target.log"), &[]);

    // Discovery: the ACL target only to its friend; the CHAP target to nobody, since open
    // discovery authenticates no one (the target's own CHAP secret does not count here).
    assert_eq!(ls(t.port, STRANGER, None), Ok(names(&[OPEN])));
    assert_eq!(ls(t.port, FRIEND, None), Ok(names(&[OPEN, ACL])));
    assert_eq!(ls(t.port, FRIEND, Some(("alice", TARGET_SECRET))), Ok(names(&[OPEN, ACL])));

    // Login: the ACL target refuses the stranger and takes the friend; the CHAP target, not
    // listed, still takes a login with its secret.
    let refused = inq(t.port, ACL, STRANGER, None).expect_err("a stranger logged in to the ACL target");
    assert!(refused.contains("Authorization failure"), "{refused}");
    inq(t.port, ACL, FRIEND, None).expect("the friend logs in to the ACL target");
    inq(t.port, OPEN, STRANGER, None).expect("anyone logs in to the open target");
    inq(t.port, CHAP, STRANGER, Some(("alice", TARGET_SECRET))).expect("CHAP target login with its secret");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a = addr(&t);
        // RFC 7143 §11.13.5: 0x0202, the initiator is not allowed access to the given target.
        let normal = |who: &'static str, target: &'static str| {
            [("InitiatorName", who), ("SessionType", "Normal"), ("TargetName", target)]
        };
        assert_eq!(login_status_of(a, 1, 3, &normal(STRANGER, ACL)).await, login_status::AUTHORIZATION_FAILURE);
        assert_eq!(login_status_of(a, 1, 3, &normal(FRIEND, ACL)).await, login_status::SUCCESS);
        // Asking for a hidden target by name reveals nothing either.
        assert_eq!(send_targets(a, STRANGER, "All").await, [OPEN]);
        assert!(send_targets(a, STRANGER, ACL).await.is_empty());
        assert!(send_targets(a, FRIEND, CHAP).await.is_empty());
        assert_eq!(send_targets(a, FRIEND, ACL).await, [ACL]);
    });
}

#[test]
fn discovery_chap_refuses_wrong_secrets_and_lists_chap_targets_to_sessions_that_pass() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("target.log");
    let toml =
        format!("[discovery]\nchap = {{ user = \"seeker\", secret = \"{DISCOVERY_SECRET}\" }}\n{}", targets_toml());
    let config = write_config(dir.path(), "target.toml", &toml);
    let t = start(&config, &[], &log, &[]);

    for (what, chap) in [
        ("no CHAP", None),
        ("a wrong secret", Some(("seeker", "wrong-secret-xyz3"))),
        ("the CHAP target's secret", Some(("alice", TARGET_SECRET))),
    ] {
        let refused = ls(t.port, FRIEND, chap).expect_err(what);
        assert!(refused.contains("Authentication failure"), "{what}: {refused}");
    }
    let right = Some(("seeker", DISCOVERY_SECRET));
    assert_eq!(ls(t.port, STRANGER, right), Ok(names(&[OPEN, CHAP])));
    assert_eq!(ls(t.port, FRIEND, right), Ok(names(&[OPEN, ACL, CHAP])));
    // Finding the CHAP target is not logging in to it: that takes the target's own secret.
    inq(t.port, CHAP, STRANGER, right).expect_err("the discovery secret opened the CHAP target");
    inq(t.port, CHAP, STRANGER, Some(("alice", TARGET_SECRET))).expect("CHAP target login with its secret");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a = addr(&t);
        let discovery = [("InitiatorName", FRIEND), ("SessionType", "Discovery")];
        let mut none = discovery.to_vec();
        none.push(("AuthMethod", "None"));
        // RFC 7143 §11.13.5: 0x0201, the initiator could not be authenticated.
        assert_eq!(login_status_of(a, 0, 1, &none).await, login_status::AUTHENTICATION_FAILURE);
        assert_eq!(login_status_of(a, 1, 3, &discovery).await, login_status::AUTHENTICATION_FAILURE);
    });
    drop(t);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("login refused"), "refused discovery logins are logged: {text}");
    assert!(!text.contains(DISCOVERY_SECRET) && !text.contains("wrong-secret-xyz3"), "a secret in the log: {text}");
}

#[test]
fn discovery_chap_from_the_command_line_gates_discovery_and_is_printed_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "target.toml", &targets_toml());
    let flags = ["--discovery-chap-user", "seeker"];
    let env = [("STICS_DISCOVERY_CHAP_SECRET", DISCOVERY_SECRET)];
    let t = start(&config, &flags, &dir.path().join("target.log"), &env);
    let refused = ls(t.port, STRANGER, None).expect_err("discovery without CHAP accepted");
    assert!(refused.contains("Authentication failure"), "{refused}");
    assert_eq!(ls(t.port, STRANGER, Some(("seeker", DISCOVERY_SECRET))), Ok(names(&[OPEN, CHAP])));
    drop(t);

    let printed = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["target", "--config", config.to_str().unwrap(), "--print-config"])
        .args(flags)
        .envs(env)
        .output()
        .unwrap();
    assert!(printed.status.success(), "{}", String::from_utf8_lossy(&printed.stderr));
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("[discovery.chap]\nuser = \"seeker\"\nsecret = \"<redacted>\""), "{printed}");
    assert!(!printed.contains(DISCOVERY_SECRET) && !printed.contains(TARGET_SECRET), "{printed}");
}
