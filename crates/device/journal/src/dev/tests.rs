use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stics_block::{BlockDev, GroupSink, MemDev};
use stics_link::group::{encode, Extent, ExtentKind, GroupHead};
use stics_link::status::Status;
use stics_testkit::faults::{FaultDev, Op, Rule};

use super::*;

const BLOCKS: u64 = 4096;

fn head(seq: u64) -> GroupHead {
    GroupHead { source: [5; 16], seq, first_epoch: seq * 10, last_epoch: seq * 10 + 3, block_size: 512 }
}

/// A group of `runs` (lba, blocks, fill; fill 0 is a discard) as source 5's group `seq`.
fn group(seq: u64, runs: &[(u64, u32, u8)]) -> Bytes {
    let mut extents = Vec::new();
    let mut data = Vec::new();
    for &(lba, blocks, fill) in runs {
        let kind = if fill == 0 { ExtentKind::Discard } else { ExtentKind::Data };
        extents.push(Extent { lba, blocks, kind });
        if fill != 0 {
            data.extend(std::iter::repeat_n(fill, blocks as usize * 512));
        }
    }
    Bytes::from(encode(&head(seq), &extents, &data, 1).expect("encodes"))
}

/// What `runs` groups, applied in order over zeros, leave at each block.
fn model(groups: &[&[(u64, u32, u8)]]) -> Vec<u8> {
    let mut m = vec![0u8; BLOCKS as usize];
    for runs in groups {
        for &(lba, blocks, fill) in *runs {
            m[lba as usize..(lba + u64::from(blocks)) as usize].fill(fill);
        }
    }
    m
}

/// Fails naming the first block where `got` and `want` differ (a whole image in a message is
/// unreadable).
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    if let Some(b) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!("{what}: block {b} holds {}, not {}", got[b], want[b]);
    }
    assert_eq!(got.len(), want.len(), "{what}");
}

async fn view(dev: &dyn BlockDev) -> Vec<u8> {
    let all = dev.read(0, BLOCKS as u32).await.expect("read");
    all.chunks(512).map(|b| b[0]).collect()
}

fn fault(seed: u64, blocks: u64) -> FaultDev {
    FaultDev::new(512, blocks, seed)
}

/// Group `seq` of `blocks` blocks of noise at `lba` (it does not compress).
fn noise_group(seq: u64, lba: u64, blocks: u32) -> Bytes {
    let data = stics_testkit::pattern::noise(seq, blocks as usize * 512);
    let extents = [Extent { lba, blocks, kind: ExtentKind::Data }];
    Bytes::from(encode(&head(seq), &extents, &data, 1).expect("encodes"))
}

const G1: &[(u64, u32, u8)] = &[(0, 8, 1), (100, 300, 2)];
const G2: &[(u64, u32, u8)] = &[(4, 8, 3), (200, 10, 0), (3000, 1, 4)];
const G3: &[(u64, u32, u8)] = &[(0, 4096, 6)];

#[tokio::test]
async fn a_committed_group_is_served_at_once_and_reaches_the_medium_whole() {
    let medium = Arc::new(MemDev::new(512, BLOCKS));
    let dev = JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium.clone(), JournalConfig::default())
        .await
        .expect("opens");
    dev.commit(group(1, G1)).await.expect("commit 1");
    dev.commit(group(2, G2)).await.expect("commit 2");
    same(&view(&dev).await, &model(&[G1, G2]), "served");
    dev.settle().await;
    same(&view(medium.as_ref()).await, &model(&[G1, G2]), "the medium alone");
    let s = dev.status();
    assert_eq!((s.groups_committed, s.groups_applied, s.groups_unapplied), (2, 2, 0));
    // Sent again after a lost answer: taken without effect.
    dev.commit(group(2, G2)).await.expect("again");
    assert_eq!(dev.status().groups_again, 1);
    let st = Status::decode(&dev.status_bytes().await).expect("status");
    let me = st.of(&[5; 16]).expect("source 5");
    assert_eq!((me.committed_seq, me.committed_epoch, me.applied_seq), (2, 23, 2));
    dev.close().await;
}

#[tokio::test]
async fn reads_are_counted_by_where_they_were_served_from() {
    // The medium refuses writes, so the group stays in the journal until the rule goes.
    let medium = fault(9, BLOCKS);
    medium.add_rule(Rule::fail(Op::Write));
    let dev =
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), Arc::new(medium.clone()), JournalConfig::default())
            .await
            .expect("opens");
    dev.commit(group(1, G1)).await.expect("commit");
    // Blocks 0..8 from the group, 8..20 from the medium, 100..104 from the group.
    dev.read(0, 20).await.expect("read");
    dev.read(100, 4).await.expect("read");
    let s = dev.status();
    assert_eq!((s.blocks_read_journal, s.blocks_read_medium), (12, 12));
    medium.clear_rules();
    dev.settle().await;
    dev.read(0, 20).await.expect("read");
    let s = dev.status();
    assert_eq!((s.blocks_read_journal, s.blocks_read_medium), (12, 32));
    dev.close().await;
}

#[tokio::test]
async fn a_group_that_comes_before_its_predecessor_waits_for_it_and_fails_with_it() {
    let medium = Arc::new(MemDev::new(512, BLOCKS));
    let dev = Arc::new(
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium.clone(), JournalConfig::default())
            .await
            .expect("opens"),
    );
    assert_eq!(dev.groups_in_flight(), 2);
    let early = tokio::spawn({
        let dev = Arc::clone(&dev);
        async move { dev.commit(group(2, G2)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!early.is_finished(), "group 2 waits for group 1");
    assert_eq!(dev.status().groups_committed, 0);
    dev.commit(group(1, G1)).await.expect("commit 1");
    early.await.expect("joins").expect("group 2 lands behind group 1");
    same(&view(dev.as_ref()).await, &model(&[G1, G2]), "in sequence");

    // Group 4 waits for group 3, which the journal refuses (past the medium): group 4 fails
    // at once rather than after the whole wait, and nothing of either lands.
    let early = tokio::spawn({
        let dev = Arc::clone(&dev);
        async move { dev.commit(group(4, G3)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(dev.commit(group(3, &[(BLOCKS - 1, 2, 9)])).await.is_err(), "past the medium");
    let e = tokio::time::timeout(AHEAD_WAIT / 2, early)
        .await
        .expect("it fails with its predecessor, not at the end of its wait")
        .expect("joins")
        .expect_err("its predecessor failed");
    assert!(e.to_string().contains("came before"), "{e}");
    same(&view(dev.as_ref()).await, &model(&[G1, G2]), "neither landed");
    dev.commit(group(3, G3)).await.expect("group 3 sent again");
    dev.commit(group(4, G1)).await.expect("then group 4");
    same(&view(dev.as_ref()).await, &model(&[G1, G2, G3, G1]), "both, in sequence");
    dev.close().await;
}

impl JournalDev {
    async fn status_bytes(&self) -> Bytes {
        self.link_status(0).await.expect("status")
    }
}

#[tokio::test]
async fn after_a_crash_the_journal_replays_whole_groups_only() {
    for crash_after in 0..3u64 {
        let journal = fault(1, 2048 * 32);
        let medium = fault(2, BLOCKS);
        // The medium is slow, so that groups wait in the journal when the power goes.
        medium.add_rule(Rule::delay(Op::Write, Duration::from_millis(5)));
        let dev = JournalDev::open(Arc::new(journal.clone()), Arc::new(medium.clone()), JournalConfig::default())
            .await
            .expect("opens");
        let groups = [G1, G2, G3];
        for (i, g) in groups.iter().enumerate() {
            dev.commit(group(i as u64 + 1, g)).await.expect("commit");
        }
        tokio::time::sleep(Duration::from_millis(crash_after * 40)).await;
        drop(dev);
        journal.crash();
        medium.crash();
        let (journal, medium) = (journal.reopen(), medium.reopen());
        let dev = JournalDev::open(Arc::new(journal), Arc::new(medium.clone()), JournalConfig::default())
            .await
            .expect("reopens");
        same(&view(&dev).await, &model(&groups), &format!("after {crash_after}: every committed group, whole"));
        dev.settle().await;
        same(&view(&medium).await, &model(&groups), "the medium after replay");
        // The source's groups are known: the next one follows, one sent again is skipped.
        dev.commit(group(3, G3)).await.expect("again");
        assert_eq!(dev.status().groups_again, 1);
        dev.close().await;
    }
}

#[tokio::test]
async fn a_record_torn_by_the_crash_was_never_answered_and_is_dropped() {
    let journal = fault(3, 2048 * 32);
    let medium = Arc::new(MemDev::new(512, BLOCKS));
    let dev =
        JournalDev::open(Arc::new(journal.clone()), medium.clone(), JournalConfig::default()).await.expect("opens");
    dev.commit(group(1, G1)).await.expect("commit");
    // The next record's write tears halfway through its group (noise: it does not compress).
    journal.tear_write(0, 4096 + 100_000);
    assert!(dev.commit(noise_group(2, 0, 1024)).await.is_err(), "a torn record is not answered GOOD");
    drop(dev);
    let dev = JournalDev::open(Arc::new(journal.reopen()), medium, JournalConfig::default()).await.expect("reopens");
    same(&view(&dev).await, &model(&[G1]), "only the whole group");
    dev.close().await;
}

#[tokio::test]
async fn a_plain_write_waits_for_the_groups_that_write_its_blocks() {
    let medium = fault(4, BLOCKS);
    medium.set_volatile_cache(false);
    // Applying stalls until the rule is cleared.
    medium.add_rule(Rule::delay(Op::Write, Duration::from_millis(300)).times(1));
    let dev = Arc::new(
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), Arc::new(medium.clone()), JournalConfig::default())
            .await
            .expect("opens"),
    );
    dev.commit(group(1, &[(10, 1, 7)])).await.expect("commit");
    let plain = Bytes::from(vec![9u8; 512]);
    dev.write(10, plain.clone(), false).await.expect("plain write");
    dev.settle().await;
    assert_eq!(dev.read(10, 1).await.expect("read"), plain, "the later plain write wins");
    assert_eq!(medium.read(10, 1).await.expect("medium"), plain, "the group never landed over it");
    dev.close().await;
}

#[tokio::test]
async fn groups_for_another_medium_or_past_the_bound_are_refused() {
    let dev = JournalDev::open(
        Arc::new(MemDev::new(512, 2048 * 16)),
        Arc::new(MemDev::new(512, 1024)),
        JournalConfig { max_group: 1 << 20, ..JournalConfig::default() },
    )
    .await
    .expect("opens");
    assert!(dev.commit(group(1, &[(2000, 1, 1)])).await.is_err(), "outside the medium");
    assert!(dev.commit(Bytes::from(vec![0u8; 2 << 20])).await.is_err(), "larger than max_group");
    assert!(dev.commit(Bytes::from_static(b"not a group")).await.is_err());
    dev.close().await;
    let other = JournalDev::open(
        Arc::new(MemDev::new(512, 2048 * 16)),
        Arc::new(MemDev::new(512, 1024)),
        JournalConfig::default(),
    )
    .await
    .expect("a fresh journal");
    drop(other);
}

#[tokio::test]
async fn a_journal_is_refused_for_another_medium() {
    let journal: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 2048 * 16));
    let dev = JournalDev::open(Arc::clone(&journal), Arc::new(MemDev::new(512, BLOCKS)), JournalConfig::default())
        .await
        .expect("opens");
    dev.close().await;
    drop(dev);
    let err = JournalDev::open(journal, Arc::new(MemDev::new(512, BLOCKS * 2)), JournalConfig::default()).await.err();
    assert!(matches!(err, Some(JournalError::WrongMedium { .. })), "{err:?}");
}

#[tokio::test]
async fn a_full_journal_makes_commits_wait_for_the_medium() {
    // Room for about two and a half large groups: the third waits until the first is applied.
    let journal: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 2 * (16 + 5 * 260)));
    let medium = fault(6, BLOCKS);
    let dev = JournalDev::open(journal, Arc::new(medium.clone()), JournalConfig::default()).await.expect("opens");
    for seq in 1..=4 {
        let g = noise_group(seq, 0, 1024);
        tokio::time::timeout(Duration::from_secs(20), dev.commit(g)).await.expect("no deadlock").expect("commit");
    }
    dev.settle().await;
    assert!(dev.status().groups_applied >= 4);
    dev.close().await;
}

#[tokio::test]
async fn a_commit_that_waited_across_a_status_read_of_its_source_is_refused() {
    let medium = Arc::new(MemDev::new(512, BLOCKS));
    let dev =
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens");
    let dev = Arc::new(dev);
    // A slow commit holds the turn: the next one waits behind it.
    let turn = dev.inner.turn.lock().await;
    let late = {
        let dev = Arc::clone(&dev);
        tokio::spawn(async move { dev.commit(group(1, G1)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The gateway restarted and asks what the SG holds, fencing its source.
    let status = {
        let dev = Arc::clone(&dev);
        tokio::spawn(async move { dev.link_status(stics_link::fence_of(&[5; 16])).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(turn);
    let refused = late.await.expect("task");
    assert!(matches!(refused, Err(BlockError::Rejected(_))), "{refused:?}");
    let st = Status::decode(&status.await.expect("task").expect("status")).expect("decode");
    assert!(st.of(&[5; 16]).is_none(), "nothing of the late group was taken");
    // The new run's own commits go on.
    dev.commit(group(1, G1)).await.expect("commit after the status");
    same(&view(dev.as_ref()).await, &model(&[G1]), "served");
    dev.close().await;
}

/// Group `seq` of one run of `fill` at `lba` from `source`, fenced under `gens` when given
/// (64 KiB segments: 128 blocks each).
fn fenced_group(source: [u8; 16], seq: u64, lba: u64, blocks: u32, fill: u8, gens: Option<Vec<(u64, u64)>>) -> Bytes {
    let head = GroupHead { source, ..head(seq) };
    let extents = [Extent { lba, blocks, kind: ExtentKind::Data }];
    let data = vec![fill; blocks as usize * 512];
    let fences = gens.map(|gens| stics_link::group::Fences { segment_bytes: 64 << 10, gens });
    Bytes::from(stics_link::group::encode_fenced(&head, &extents, &data, 1, fences.as_ref()).expect("encodes"))
}

#[tokio::test]
async fn a_group_lands_only_under_the_tokens_it_was_written_under() {
    use stics_coherence::{Kind, Msg};
    use stics_link::token;
    let medium = Arc::new(MemDev::new(512, BLOCKS));
    let dev =
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens");
    let (a, b) =
        ([1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], [2u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
    let ask = |src: [u8; 16], seg| {
        Bytes::from(token::encode_exchange(&src, &[Msg::Request { op: seg + 1, seg, kind: Kind::Exclusive }]))
    };
    dev.tokens(ask(a, 1), true).await.expect("exchange");
    let got =
        token::decode_answer(&dev.token_poll(stics_link::fence_of(&a), 0, Duration::ZERO, 4096).await.unwrap(), 64)
            .unwrap()
            .1;
    let [Msg::Grant { gen, .. }] = got[..] else { panic!("{got:?}") };
    // A writes segment 1 (blocks 128..256) under its token: it lands.
    dev.commit(fenced_group(a, 1, 130, 8, 7, Some(vec![(1, gen)]))).await.expect("under its token");
    // B claims a generation it was never granted: refused, and nothing of it is served.
    let e = dev.commit(fenced_group(b, 1, 130, 8, 8, Some(vec![(1, gen)]))).await.unwrap_err();
    assert!(e.to_string().contains("fenced"), "{e}");
    // A group without generations may not write a segment someone holds, and may elsewhere.
    let e = dev.commit(fenced_group(b, 1, 140, 1, 9, None)).await.unwrap_err();
    assert!(e.to_string().contains("holds a token"), "{e}");
    dev.commit(fenced_group(b, 1, 3000, 1, 9, None)).await.expect("an unshared segment");
    // Segments of another size than the SG's are refused.
    let odd = {
        let head = GroupHead { source: a, ..head(2) };
        let extents = [Extent { lba: 130, blocks: 1, kind: ExtentKind::Data }];
        let f = stics_link::group::Fences { segment_bytes: 128 << 10, gens: vec![(0, gen)] };
        Bytes::from(stics_link::group::encode_fenced(&head, &extents, &[1; 512], 1, Some(&f)).unwrap())
    };
    assert!(dev.commit(odd).await.unwrap_err().to_string().contains("segments of"));
    // Once A gives the token up, its late group under the old generation is refused.
    let release = token::encode_exchange(&a, &[Msg::Release { seg: 1, gen, keep: None }]);
    dev.tokens(Bytes::from(release), false).await.expect("exchange");
    let e = dev.commit(fenced_group(a, 2, 131, 1, 5, Some(vec![(1, gen)]))).await.unwrap_err();
    assert!(e.to_string().contains("fenced"), "{e}");
    let blocks = dev.read(128, 16).await.unwrap();
    assert!(blocks.chunks(512).skip(2).take(8).all(|b| b.iter().all(|&x| x == 7)), "only A's first group is there");
    dev.close().await;
}

#[tokio::test]
async fn a_reader_s_grant_brings_the_blocks_it_wants_as_the_last_writer_left_them() {
    use stics_coherence::{Kind, Msg};
    use stics_link::token;
    let medium = Arc::new(MemDev::new(512, BLOCKS));
    let dev =
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens");
    let st = Status::decode(&dev.link_status(0).await.unwrap()).unwrap();
    assert_ne!(st.features & stics_link::status::FEATURE_GRANT_DATA, 0, "the SG says it sends data with grants");
    let (a, b) =
        ([1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], [2u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
    let poll = |src: [u8; 16], from: u32, max: usize| {
        let dev = &dev;
        async move {
            let b = dev.token_poll(stics_link::fence_of(&src), from, Duration::ZERO, max).await.unwrap();
            token::decode_answer_data(&b, 64).unwrap()
        }
    };
    // A writes blocks 130..138 of segment 1 under its exclusive token, and gives it up.
    let ask = token::encode_exchange(&a, &[Msg::Request { op: 1, seg: 1, kind: Kind::Exclusive }]);
    dev.tokens(Bytes::from(ask), true).await.unwrap();
    let (_, got, data) = poll(a, 0, 4096).await;
    let [Msg::Grant { gen, .. }] = got[..] else { panic!("{got:?}") };
    assert!(data.is_empty(), "nobody wanted anything with an exclusive grant");
    dev.commit(fenced_group(a, 1, 130, 8, 7, Some(vec![(1, gen)]))).await.unwrap();
    let release = token::encode_exchange(&a, &[Msg::Release { seg: 1, gen, keep: None }]);
    dev.tokens(Bytes::from(release), false).await.unwrap();
    // B will read blocks 129..139 (the segment's blocks 1..11): they come with its grant.
    let want = [Msg::Want { op: 1, seg: 1, first: 1, blocks: 10 }, Msg::Request { op: 1, seg: 1, kind: Kind::Shared }];
    dev.tokens(Bytes::from(token::encode_exchange(&b, &want)), true).await.unwrap();
    let (first, got, data) = poll(b, 0, 64 << 10).await;
    let [Msg::Grant { kind: Kind::Shared, gen: shared, .. }] = got[..] else { panic!("{got:?}") };
    let [token::GrantData { seg: 1, gen: g, first: 1, data: ref blocks }] = data[..] else { panic!("{data:?}") };
    assert_eq!(g, shared);
    assert_eq!(blocks.len(), 10 * 512);
    assert!(blocks[..512].iter().all(|&x| x == 0) && blocks[512..9 * 512].iter().all(|&x| x == 7));
    assert!(blocks[9 * 512..].iter().all(|&x| x == 0));
    // Asked again with room for the grant but not its blocks, it comes alone: B reads after it.
    let (_, again, data) = poll(b, first, token::answer_len(1) + 100).await;
    assert_eq!((again, data), (got, vec![]));
    assert_eq!(dev.token_status().grant_data_blocks, 10);
    dev.close().await;
}

mod tokens_kept {
    use super::*;
    use stics_coherence::{Kind, Msg};
    use stics_link::token;

    fn gw(n: u8) -> [u8; 16] {
        let mut s = [0; 16];
        s[0] = n;
        s[15] = 9;
        s
    }

    fn ask(src: [u8; 16], op: u64, seg: u64, kind: Kind) -> Bytes {
        Bytes::from(token::encode_exchange(&src, &[Msg::Request { op, seg, kind }]))
    }

    /// What the SG has for gateway `src` that it has not read yet (it reads on from whatever
    /// number the queue has, and acknowledges what it read).
    async fn inbox(dev: &JournalDev, src: [u8; 16], wait: Duration) -> Vec<Msg> {
        let fold = stics_link::fence_of(&src);
        let poll = |from, wait| async move {
            token::decode_answer(&dev.token_poll(fold, from, wait, 4096).await.unwrap(), 4096).unwrap()
        };
        let (first, _) = poll(0, Duration::ZERO).await;
        let (first, msgs) = poll(first, wait).await;
        poll(first.wrapping_add(msgs.len() as u32), Duration::ZERO).await;
        msgs
    }

    fn granted(msgs: &[Msg], seg: u64) -> u64 {
        msgs.iter()
            .find_map(|m| match *m {
                Msg::Grant { seg: s, gen, .. } if s == seg => Some(gen),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no grant of segment {seg} in {msgs:?}"))
    }

    #[tokio::test]
    async fn the_lock_server_s_table_survives_an_sg_crash_and_its_generations_go_on() {
        let journal = fault(11, 2048 * 16);
        let medium = Arc::new(MemDev::new(512, BLOCKS));
        let dev = JournalDev::open(Arc::new(journal.clone()), medium.clone(), JournalConfig::default()).await.unwrap();
        let (a, b, c) = (gw(1), gw(2), gw(3));
        dev.tokens(ask(a, 1, 1, Kind::Exclusive), true).await.unwrap();
        let gen_a = granted(&inbox(&dev, a, Duration::ZERO).await, 1);
        dev.tokens(ask(b, 1, 2, Kind::Shared), true).await.unwrap();
        granted(&inbox(&dev, b, Duration::ZERO).await, 2);
        // B waits for segment 1 when the power goes.
        dev.tokens(ask(b, 2, 1, Kind::Exclusive), false).await.unwrap();
        drop(dev);
        journal.crash();
        let journal = journal.reopen();
        let dev = JournalDev::open(Arc::new(journal.clone()), medium.clone(), JournalConfig::default()).await.unwrap();
        let s = dev.token_status();
        assert_eq!((s.gateways, s.held_exclusive, s.held_shared), (2, 1, 1), "{s:?}");
        // A's token is still good: its group lands; B's claim to it does not.
        dev.commit(fenced_group(a, 1, 130, 8, 7, Some(vec![(1, gen_a)]))).await.expect("under A's token");
        let e = dev.commit(fenced_group(b, 1, 131, 1, 8, Some(vec![(1, gen_a)]))).await.unwrap_err();
        assert!(e.to_string().contains("fenced"), "{e}");
        // No generation is handed out twice.
        dev.tokens(ask(c, 1, 5, Kind::Exclusive), true).await.unwrap();
        let gen_c = granted(&inbox(&dev, c, Duration::ZERO).await, 5);
        assert!(gen_c > gen_a, "{gen_c} after {gen_a}");
        // B asks again (it lost its connection): A is asked for segment 1, gives it up, and B
        // gets it under a generation of its own.
        dev.tokens(ask(b, 2, 1, Kind::Exclusive), true).await.unwrap();
        assert!(inbox(&dev, a, Duration::ZERO).await.iter().any(|m| matches!(m, Msg::Revoke { seg: 1, .. })));
        let release = token::encode_exchange(&a, &[Msg::Release { seg: 1, gen: gen_a, keep: None }]);
        dev.tokens(Bytes::from(release), false).await.unwrap();
        let gen_b = granted(&inbox(&dev, b, Duration::ZERO).await, 1);
        assert!(gen_b > gen_c);
        // Reopened once more, cleanly: the last changes are there too.
        dev.close().await;
        drop(dev);
        let dev = JournalDev::open(Arc::new(journal), medium, JournalConfig::default()).await.unwrap();
        dev.commit(fenced_group(b, 1, 132, 1, 8, Some(vec![(1, gen_b)]))).await.expect("under B's token");
        assert!(dev.commit(fenced_group(a, 2, 133, 1, 7, Some(vec![(1, gen_a)]))).await.is_err());
        dev.close().await;
    }

    #[tokio::test]
    async fn a_token_change_that_did_not_become_durable_is_not_said_until_the_table_is_written_whole() {
        let journal = fault(12, 2048 * 16);
        let medium = Arc::new(MemDev::new(512, BLOCKS));
        let dev = JournalDev::open(Arc::new(journal.clone()), medium.clone(), JournalConfig::default()).await.unwrap();
        let a = gw(1);
        journal.add_rule(Rule::fail(Op::Write));
        assert!(dev.tokens(ask(a, 1, 1, Kind::Exclusive), true).await.is_err());
        assert!(inbox(&dev, a, Duration::ZERO).await.is_empty(), "a grant that is not durable is not sent");
        journal.clear_rules();
        // The tick writes the table whole within a second, and the grant goes out.
        let gen = granted(&inbox(&dev, a, Duration::from_secs(4)).await, 1);
        drop(dev);
        journal.crash();
        let dev = JournalDev::open(Arc::new(journal.reopen()), medium, JournalConfig::default()).await.unwrap();
        assert_eq!(dev.token_status().held_exclusive, 1);
        dev.commit(fenced_group(a, 1, 130, 1, 7, Some(vec![(1, gen)]))).await.expect("under the token sent");
        dev.close().await;
    }

    #[tokio::test]
    async fn the_ring_moves_past_the_table_s_copies_and_a_reopen_finds_the_newest() {
        // A ring of 1 MiB: sixty groups of 32 KiB go round it several times.
        let journal = Arc::new(MemDev::new(512, 2048 + 16));
        let medium = Arc::new(MemDev::new(512, BLOCKS));
        let dev = JournalDev::open(journal.clone(), medium.clone(), JournalConfig::default()).await.unwrap();
        let a = gw(1);
        let mut gens = std::collections::BTreeMap::new();
        for i in 0..60u64 {
            let seg = i % 7;
            match gens.remove(&seg) {
                None => {
                    dev.tokens(ask(a, i + 1, seg, Kind::Exclusive), false).await.unwrap();
                    gens.insert(seg, granted(&inbox(&dev, a, Duration::ZERO).await, seg));
                }
                Some(gen) => {
                    let release = token::encode_exchange(&a, &[Msg::Release { seg, gen, keep: None }]);
                    dev.tokens(Bytes::from(release), false).await.unwrap();
                }
            }
            let commit = dev.commit(noise_group(i + 1, 3000, 64));
            tokio::time::timeout(Duration::from_secs(10), commit).await.expect("never stalls").unwrap();
        }
        dev.settle().await;
        let before = dev.token_status();
        dev.close().await;
        drop(dev);
        let dev = JournalDev::open(journal, medium, JournalConfig::default()).await.unwrap();
        let after = dev.token_status();
        assert_eq!((after.held_exclusive, after.gateways), (before.held_exclusive, 1));
        assert_eq!(after.held_exclusive, gens.len());
        for (seq, (seg, gen)) in (1..).zip(gens) {
            let lba = seg * 128;
            dev.commit(fenced_group(a, seq, lba, 1, 1, Some(vec![(seg, gen)])))
                .await
                .unwrap_or_else(|e| panic!("segment {seg} under {gen}: {e}"));
        }
        dev.close().await;
    }

    #[tokio::test]
    async fn a_journal_whose_tokens_cover_other_segments_is_refused_until_nothing_is_held() {
        let journal = Arc::new(MemDev::new(512, 2048 * 16));
        let medium = Arc::new(MemDev::new(512, BLOCKS));
        let dev = JournalDev::open(journal.clone(), medium.clone(), JournalConfig::default()).await.unwrap();
        let a = gw(1);
        dev.tokens(ask(a, 1, 1, Kind::Exclusive), true).await.unwrap();
        let gen = granted(&inbox(&dev, a, Duration::ZERO).await, 1);
        dev.close().await;
        drop(dev);
        let other = JournalConfig { segment_bytes: 128 << 10, ..JournalConfig::default() };
        let e = JournalDev::open(journal.clone(), medium.clone(), other.clone()).await.unwrap_err();
        assert!(e.to_string().contains("segment=65536"), "{e}");
        let dev = JournalDev::open(journal.clone(), medium.clone(), JournalConfig::default()).await.unwrap();
        let release = token::encode_exchange(&a, &[Msg::Release { seg: 1, gen, keep: None }]);
        dev.tokens(Bytes::from(release), false).await.unwrap();
        dev.close().await;
        drop(dev);
        JournalDev::open(journal, medium, other).await.expect("nothing is held: the new size is taken").close().await;
    }
}

#[tokio::test]
async fn a_commit_marked_before_its_source_was_fenced_is_refused_and_one_marked_after_lands() {
    let dev = JournalDev::open(
        Arc::new(MemDev::new(512, 2048 * 16)),
        Arc::new(MemDev::new(512, BLOCKS)),
        JournalConfig::default(),
    )
    .await
    .expect("opens");
    // A commit arrives (its pieces still on their way) and a restarted gateway of the same
    // source reads the status with its fence meanwhile: that group must not land.
    let before = dev.fence_mark();
    dev.link_status(stics_link::fence_of(&[5; 16])).await.expect("status");
    let e = dev.commit_marked(group(1, G1), before).await.expect_err("fenced");
    assert!(e.to_string().contains("read the status"), "{e}");
    // Another source's fence does not touch it, and a commit marked after the fence lands.
    let after = dev.fence_mark();
    let other: [u8; 16] = std::array::from_fn(|i| i as u8);
    assert_ne!(stics_link::fence_of(&other), stics_link::fence_of(&[5; 16]));
    dev.link_status(stics_link::fence_of(&other)).await.expect("status");
    dev.commit_marked(group(1, G1), after).await.expect("lands");
    same(&view(&dev).await, &model(&[G1]), "served");
    dev.close().await;
}
