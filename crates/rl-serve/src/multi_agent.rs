//! Multi-agent environments: members with explicit ids, a schedule of slots (one member: a turn;
//! several: a simultaneous slot that commits all-or-nothing), per-member views that only ever grow
//! (a member's prompt for its next turn extends its previous prompt byte for byte, so prefix caches
//! hold), public and private channels (`<think>...</think>` is private; malformed markup is
//! quarantined with `parse_error`), a kernel that rejects protocol violations with a typed error,
//! and `MARScore`: one reward per member, or an episode error.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::types::{Message, Role, Task, TrainingContext};

/// A violation of the episode protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A member id that is not part of the episode.
    #[error("unknown member `{0}`")]
    UnknownMember(String),
    /// A member acted outside its slot.
    #[error("member `{member}` may not act in slot {slot} (expected one of: {expected})")]
    WrongMember {
        /// Who acted.
        member: String,
        /// The current slot.
        slot: usize,
        /// Members of the slot.
        expected: String,
    },
    /// A member submitted twice in one slot.
    #[error("member `{member}` already submitted in slot {slot}")]
    Duplicate {
        /// Who acted.
        member: String,
        /// The current slot.
        slot: usize,
    },
    /// A member acted after the schedule ended.
    #[error("member `{0}` acted after the episode ended")]
    AfterEnd(String),
    /// The member list or the schedule is malformed.
    #[error("invalid episode layout: {0}")]
    Layout(String),
}

/// One committed (or pending) turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// Who spoke.
    pub member: String,
    /// The full reply (what the member itself sees again).
    pub raw: String,
    /// What peers see (private blocks removed; empty when quarantined).
    pub public: String,
    /// Private text (the contents of `<think>` blocks).
    pub private: String,
    /// The markup was malformed: the turn is quarantined (peers see nothing, it is not trained).
    pub parse_error: bool,
    /// The slot it was committed in.
    pub slot: usize,
}

/// Splits a reply into public and private text. `<think>...</think>` blocks are private; an
/// unclosed, unopened or nested block makes the whole reply quarantined.
pub fn split_channels(raw: &str) -> (String, String, bool) {
    let (mut public, mut private) = (String::new(), Vec::new());
    let mut rest = raw;
    loop {
        let open = rest.find("<think>");
        let close = rest.find("</think>");
        match (open, close) {
            (None, None) => {
                public.push_str(rest);
                break;
            }
            (Some(o), Some(c)) if o < c => {
                let inner = &rest[o + "<think>".len()..c];
                if inner.contains("<think>") {
                    return (String::new(), String::new(), true);
                }
                public.push_str(&rest[..o]);
                private.push(inner.trim().to_owned());
                rest = &rest[c + "</think>".len()..];
            }
            _ => return (String::new(), String::new(), true),
        }
    }
    (public.trim().to_owned(), private.join("\n"), false)
}

impl Turn {
    /// A turn from a member's raw reply.
    pub fn new(member: &str, raw: &str) -> Self {
        let (public, private, parse_error) = split_channels(raw);
        Turn { member: member.to_owned(), raw: raw.to_owned(), public, private, parse_error, slot: 0 }
    }
}

/// The episode kernel: who may act now, pending submissions of the current slot, committed turns.
#[derive(Debug, Clone)]
pub struct Kernel {
    members: Vec<String>,
    schedule: Vec<Vec<String>>,
    slot: usize,
    pending: BTreeMap<String, Turn>,
    log: Vec<Turn>,
}

impl Kernel {
    /// Checks the layout: member ids explicit, non-empty and unique; every slot non-empty, without
    /// repeats, naming known members only.
    pub fn new(members: Vec<String>, schedule: Vec<Vec<String>>) -> std::result::Result<Self, ProtocolError> {
        let mut seen = BTreeSet::new();
        for m in &members {
            if m.trim().is_empty() {
                return Err(ProtocolError::Layout(String::from("member ids must be non-empty")));
            }
            if !seen.insert(m.as_str()) {
                return Err(ProtocolError::Layout(format!("member `{m}` is listed twice")));
            }
        }
        if members.is_empty() || schedule.is_empty() {
            return Err(ProtocolError::Layout(String::from("an episode needs members and at least one slot")));
        }
        for (i, slot) in schedule.iter().enumerate() {
            let mut in_slot = BTreeSet::new();
            if slot.is_empty() {
                return Err(ProtocolError::Layout(format!("slot {i} has no members")));
            }
            for m in slot {
                if !seen.contains(m.as_str()) {
                    return Err(ProtocolError::UnknownMember(m.clone()));
                }
                if !in_slot.insert(m.as_str()) {
                    return Err(ProtocolError::Layout(format!("slot {i} lists `{m}` twice")));
                }
            }
        }
        Ok(Kernel { members, schedule, slot: 0, pending: BTreeMap::new(), log: Vec::new() })
    }

    /// The members.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Members of the current slot, or `None` when the schedule is over.
    pub fn current(&self) -> Option<&[String]> {
        self.schedule.get(self.slot).map(Vec::as_slice)
    }

    /// The current slot index.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The schedule is over.
    pub fn done(&self) -> bool {
        self.slot >= self.schedule.len()
    }

    /// Committed turns, in order.
    pub fn log(&self) -> &[Turn] {
        &self.log
    }

    /// Records a member's reply for the current slot. When every member of the slot has submitted,
    /// the slot commits (all its turns at once) and they are returned; before that, nothing is
    /// visible to anyone.
    pub fn submit(&mut self, member: &str, raw: &str) -> std::result::Result<Option<Vec<Turn>>, ProtocolError> {
        if !self.members.iter().any(|m| m == member) {
            return Err(ProtocolError::UnknownMember(member.to_owned()));
        }
        let slot = self.slot;
        let Some(current) = self.schedule.get(slot) else {
            return Err(ProtocolError::AfterEnd(member.to_owned()));
        };
        if !current.iter().any(|m| m == member) {
            return Err(ProtocolError::WrongMember { member: member.to_owned(), slot, expected: current.join(", ") });
        }
        if self.pending.contains_key(member) {
            return Err(ProtocolError::Duplicate { member: member.to_owned(), slot });
        }
        self.pending.insert(member.to_owned(), Turn { slot, ..Turn::new(member, raw) });
        if self.pending.len() < current.len() {
            return Ok(None);
        }
        // Commit in the slot's member order.
        let committed: Vec<Turn> =
            current.iter().map(|m| self.pending.remove(m).expect("every slot member submitted")).collect();
        self.log.extend(committed.iter().cloned());
        self.slot += 1;
        Ok(Some(committed))
    }

    /// What `member` sees now: its instructions, then the committed turns slot by slot — its own
    /// as assistant messages (raw, private text included) before its peers' turns of the same slot
    /// (it acted without seeing them), peers' public text as user messages (consecutive ones
    /// folded into one, quarantined turns left out). So each view extends the member's last one.
    pub fn view(&self, member: &str, instructions: &[Message]) -> Vec<Message> {
        let mut out = instructions.to_vec();
        let mut ordered: Vec<&Turn> = self.log.iter().collect();
        ordered.sort_by_key(|t| (t.slot, t.member != member));
        for t in ordered {
            if t.member == member {
                out.push(Message::assistant(t.raw.clone()));
                continue;
            }
            if t.parse_error || t.public.is_empty() {
                continue;
            }
            let line = format!("[{}]: {}", t.member, t.public);
            match out.last_mut() {
                Some(last) if last.role == Role::User => {
                    last.content.push_str("\n\n");
                    last.content.push_str(&line);
                }
                _ => out.push(Message::user(line)),
            }
        }
        out
    }
}

/// Per-member rewards of an episode, with episode metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MARScore {
    /// Reward of every member.
    pub rewards: BTreeMap<String, f64>,
    /// Episode-level metrics.
    pub metrics: BTreeMap<String, f64>,
}

impl MARScore {
    /// Checks that every member has a (finite) reward and no one else does.
    pub fn validate(&self, members: &[String]) -> Result<()> {
        let missing: Vec<&str> =
            members.iter().filter(|m| !self.rewards.contains_key(*m)).map(String::as_str).collect();
        if !missing.is_empty() {
            return Err(Error::Env(format!("MARScore has no reward for member(s) {}", missing.join(", "))));
        }
        if let Some(extra) = self.rewards.keys().find(|k| !members.contains(k)) {
            return Err(Error::Env(format!("MARScore rewards unknown member `{extra}`")));
        }
        if let Some((m, r)) = self.rewards.iter().find(|(_, r)| !r.is_finite()) {
            return Err(Error::Env(format!("MARScore reward of `{m}` is not finite: {r}")));
        }
        Ok(())
    }
}

/// A multi-agent environment (the env's `Environment::multi_agent` returns it).
#[async_trait]
pub trait MultiAgent: Send + Sync {
    /// Member ids of a task's episode.
    fn members(&self, task: &Task) -> Vec<String>;
    /// The slots, in order.
    fn schedule(&self, task: &Task) -> Vec<Vec<String>>;
    /// A member's first messages (its role and the task).
    fn instructions(&self, task: &Task, member: &str) -> Vec<Message>;
    /// Key of the model a member samples with (`None`: the request's actor).
    fn member_model(&self, _member: &str) -> Option<String> {
        None
    }
    /// The member whose turns only judge (dropped from training by default), if any.
    fn judge(&self) -> Option<String> {
        None
    }
    /// Scores a finished episode.
    async fn score(&self, task: &Task, log: &[Turn], context: Option<&TrainingContext>) -> Result<MARScore>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn debate() -> Kernel {
        Kernel::new(ids(&["a", "b", "judge"]), vec![ids(&["a", "b"]), ids(&["a"]), ids(&["b"]), ids(&["judge"])])
            .unwrap()
    }

    #[test]
    fn think_blocks_are_private_and_malformed_markup_is_quarantined() {
        assert_eq!(
            split_channels("<think>secret</think> 42 is right"),
            (String::from("42 is right"), String::from("secret"), false)
        );
        assert_eq!(
            split_channels("a <think>x</think> b <think>y</think>"),
            (String::from("a  b"), String::from("x\ny"), false)
        );
        assert!(split_channels("<think>never closed").2);
        assert!(split_channels("stray </think> close").2);
        assert!(split_channels("<think>a<think>b</think></think>").2);
    }

    #[test]
    fn simultaneous_slots_commit_all_or_nothing() {
        let mut k = debate();
        assert_eq!(k.submit("a", "A says 4").unwrap(), None);
        assert!(k.log().is_empty(), "nothing is visible until the whole slot is in");
        assert!(!k.view("b", &[]).iter().any(|m| m.content.contains("A says")));
        let committed = k.submit("b", "B says 5").unwrap().unwrap();
        assert_eq!(committed.iter().map(|t| t.member.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(k.slot(), 1);
    }

    #[test]
    fn protocol_violations_are_typed_errors() {
        let mut k = debate();
        assert!(matches!(k.submit("judge", "x"), Err(ProtocolError::WrongMember { slot: 0, .. })));
        k.submit("a", "x").unwrap();
        assert!(matches!(k.submit("a", "again"), Err(ProtocolError::Duplicate { .. })));
        assert!(matches!(k.submit("carol", "x"), Err(ProtocolError::UnknownMember(_))));
        k.submit("b", "y").unwrap();
        k.submit("a", "x").unwrap();
        k.submit("b", "y").unwrap();
        k.submit("judge", "A").unwrap();
        assert!(k.done());
        assert!(matches!(k.submit("a", "late"), Err(ProtocolError::AfterEnd(_))));
        assert!(Kernel::new(ids(&["a", "a"]), vec![ids(&["a"])]).is_err(), "duplicate member ids");
        assert!(Kernel::new(ids(&["a", ""]), vec![ids(&["a"])]).is_err(), "empty member id");
        assert!(Kernel::new(ids(&["a"]), vec![ids(&["b"])]).is_err(), "unknown member in a slot");
    }

    #[test]
    fn views_only_grow_and_peers_never_see_private_text() {
        let instructions = vec![Message::system("you are b"), Message::user("Question: 2+2?")];
        let mut k = debate();
        k.submit("a", "<think>I will bluff</think>It is 5.").unwrap();
        k.submit("b", "It is 4.").unwrap();
        let before = k.view("b", &instructions);
        k.submit("a", "<think>unclosed").unwrap();
        let after_a = k.view("b", &instructions);
        assert_eq!(after_a, before, "a quarantined turn is invisible to peers");
        k.submit("b", "Still 4.").unwrap();
        k.submit("judge", "<verdict>B</verdict>").unwrap();
        let after = k.view("b", &instructions);
        assert_eq!(&after[..before.len()], &before[..], "the earlier view is a prefix of the later one");
        let all: String = after.iter().map(|m| m.content.as_str()).collect();
        assert!(all.contains("It is 5.") && !all.contains("bluff"), "peers see public text only: {all}");
        // In the simultaneous slot b acted on the bare question: its own reply comes first.
        assert_eq!(before.len(), 4, "{before:?}");
        assert_eq!(before[1].content, "Question: 2+2?");
        assert_eq!(before[2].content, "It is 4.");
        // a sees its own private reasoning again.
        assert!(k.view("a", &[]).iter().any(|m| m.content.contains("bluff")));
    }

    #[test]
    fn sequential_turns_fold_peer_messages_into_one_user_message() {
        let mut k = Kernel::new(ids(&["a", "b", "c"]), vec![ids(&["a"]), ids(&["b"]), ids(&["c"])]).unwrap();
        let instructions = vec![Message::system("you are c"), Message::user("Q")];
        k.submit("a", "one").unwrap();
        k.submit("b", "two").unwrap();
        let view = k.view("c", &instructions);
        assert_eq!(view.len(), 2);
        assert_eq!(view[1].content, "Q\n\n[a]: one\n\n[b]: two");
    }

    #[test]
    fn partial_scores_are_rejected() {
        let members = ids(&["a", "b", "judge"]);
        let mut s = MARScore {
            rewards: BTreeMap::from([(String::from("a"), 1.0), (String::from("b"), -1.0)]),
            ..Default::default()
        };
        assert!(s.validate(&members).unwrap_err().to_string().contains("judge"));
        s.rewards.insert(String::from("judge"), 0.0);
        s.validate(&members).unwrap();
        s.rewards.insert(String::from("eve"), 0.0);
        assert!(s.validate(&members).is_err());
    }
}
