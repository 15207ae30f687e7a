//! Counts an `iscsi-test-cu` log the strict way, as every conformance number of stics is counted.
//!
//! Each suite.test counts once. It failed if CUnit failed it or it printed `[FAILED]` (CUnit counts
//! some of those as passed); it was skipped if it printed `[SKIPPED]`; otherwise it is a real pass.
//! One libiscsi test prints `[FAILED]` for every correct target: iSCSIdatasn.iSCSIDataSnInvalid
//! sends Data-Out PDUs with wrong DataSNs and asserts that the WRITE does not succeed, but calls its
//! helper with "expect GOOD", which prints `[FAILED]` whenever the status is not GOOD. When its CUnit
//! assertions pass it is reported apart, as `by_design`, and not counted as a failure.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use serde::Serialize;

/// Tests that print `[FAILED]` against a correct target.
pub const BY_DESIGN: &[&str] = &["iSCSIdatasn.iSCSIDataSnInvalid"];

/// The counts of one log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub tests: usize,
    pub real_passes: usize,
    pub skipped: usize,
    pub failed: Vec<String>,
    pub by_design: Vec<String>,
}

/// A CUnit failure mark that is not libiscsi's own `[FAILED]`.
fn cunit_failed(line: &str) -> bool {
    line.match_indices("FAILED").any(|(at, mark)| {
        let open = line.get(..at).is_some_and(|before| before.ends_with('['));
        let close = line.get(at + mark.len()..).is_some_and(|after| after.starts_with(']'));
        !open && !close
    })
}

/// Counts `log`, the output of `iscsi-test-cu -d --test=ALL URL`.
pub fn count(log: &str) -> Counts {
    let mut order: Vec<String> = Vec::new();
    let mut bodies: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    let (mut suite, mut current): (String, Option<String>) = (String::new(), None);
    for line in log.lines() {
        if let Some(s) = line.strip_prefix("Suite: ") {
            s.trim().clone_into(&mut suite);
            current = None;
            continue;
        }
        let trimmed = line.trim_start();
        if line.len() > trimmed.len() {
            if let Some(rest) = trimmed.strip_prefix("Test: ") {
                if let Some((name, tail)) = rest.split_once(" ...") {
                    if !name.contains(char::is_whitespace) {
                        let key = format!("{suite}.{name}");
                        if !bodies.contains_key(&key) {
                            order.push(key.clone());
                        }
                        bodies.entry(key.clone()).or_default().push(tail.to_owned());
                        current = Some(key);
                        continue;
                    }
                }
            }
        }
        if line.starts_with("Run Summary") {
            current = None;
        } else if let Some(c) = &current {
            bodies.entry(c.clone()).or_default().push(line.to_owned());
        }
    }
    let mut out = Counts { tests: order.len(), ..Counts::default() };
    for name in order {
        let body = bodies.get(&name).map(|b| b.join("\n")).unwrap_or_default();
        let printed_failed = body.contains("[FAILED]");
        if body.lines().any(cunit_failed) || (printed_failed && !BY_DESIGN.contains(&name.as_str())) {
            out.failed.push(name);
        } else if printed_failed {
            out.by_design.push(name);
        } else if body.contains("[SKIPPED]") {
            out.skipped += 1;
        } else {
            out.real_passes += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
Suite: Read10
  Test: Simple ...passed
  Test: Beyond ...
    [SKIPPED] not supported
passed
  Test: Beyond ...
    [SKIPPED] again
passed
Suite: Write
  Test: Bad ...FAILED
    1. test_write.c:12  - CU_ASSERT(x)
  Test: Marked ...
    [FAILED] status was not GOOD
passed
Suite: iSCSIdatasn
  Test: iSCSIDataSnInvalid ...
    [FAILED] expected GOOD
passed
Run Summary:    Type  Total    Ran Passed Failed Inactive
              suites      3      3    n/a      0        0
";

    #[test]
    fn counts_each_test_once_and_printed_failures_as_failures() {
        let c = count(LOG);
        assert_eq!(c.tests, 5);
        assert_eq!(c.real_passes, 1);
        assert_eq!(c.skipped, 1);
        assert_eq!(c.failed, vec!["Write.Bad".to_owned(), "Write.Marked".to_owned()]);
        assert_eq!(c.by_design, vec!["iSCSIdatasn.iSCSIDataSnInvalid".to_owned()]);
    }

    #[test]
    fn only_bare_failed_is_a_cunit_failure() {
        assert!(cunit_failed("  Test: X ...FAILED"));
        assert!(!cunit_failed("    [FAILED] libiscsi says"));
        assert!(cunit_failed("[FAILED] and FAILED"));
    }

    #[test]
    fn a_mark_at_either_end_of_the_line_or_half_bracketed() {
        assert!(cunit_failed("FAILED"));
        assert!(cunit_failed("FAILEDFAILED"));
        assert!(!cunit_failed("[FAILED"));
        assert!(!cunit_failed("FAILED]"));
        assert!(!cunit_failed("[FAILED]"));
        assert!(!cunit_failed("FAILE"));
        assert!(!cunit_failed(""));
        assert!(cunit_failed("é FAILED é"));
    }
}
