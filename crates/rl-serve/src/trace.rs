//! Traces as message graphs: building them turn by turn from the tokens the model endpoint returns,
//! deriving branches (root-to-leaf token sequences), and checking their internal lengths.

use rl_proto::env::v1 as pb;

use crate::error::{Error, Result};
use crate::model_client::Choice;
use crate::types::{Message, message_node};

/// One branch of a trace: a root-to-leaf path and its concatenated tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Branch {
    /// Node indices from root to leaf.
    pub nodes: Vec<usize>,
    /// Concatenated token ids.
    pub token_ids: Vec<u32>,
    /// True on sampled tokens.
    pub mask: Vec<bool>,
    /// Inference logprob per token (0 on non-sampled tokens).
    pub logprobs: Vec<f32>,
}

/// The branches of a trace, ordered by leaf index.
pub fn branches(trace: &pb::Trace) -> Vec<Branch> {
    let n = trace.nodes.len();
    let mut is_parent = vec![false; n];
    for node in &trace.nodes {
        if let Ok(p) = usize::try_from(node.parent)
            && p < n
        {
            is_parent[p] = true;
        }
    }
    let mut out = Vec::new();
    for leaf in (0..n).filter(|&i| !is_parent[i]) {
        let mut path = vec![leaf];
        let mut cur = leaf;
        while let Ok(p) = usize::try_from(trace.nodes[cur].parent) {
            if p >= cur || path.len() > n {
                break;
            }
            path.push(p);
            cur = p;
        }
        path.reverse();
        let mut b = Branch { nodes: path.clone(), token_ids: Vec::new(), mask: Vec::new(), logprobs: Vec::new() };
        for &i in &path {
            let node = &trace.nodes[i];
            let mut lp = node.logprobs.iter();
            for (t, m) in node.token_ids.iter().zip(&node.mask) {
                b.token_ids.push(*t);
                b.mask.push(*m);
                b.logprobs.push(if *m { lp.next().copied().unwrap_or(0.0) } else { 0.0 });
            }
        }
        out.push(b);
    }
    out
}

/// Checks every node's parallel lengths; `field` names the trace in errors.
pub fn check_trace(trace: &pb::Trace, field: &str) -> Result<()> {
    for (i, node) in trace.nodes.iter().enumerate() {
        let f = format!("{field}.nodes[{i}]");
        if node.parent >= i as i32 || node.parent < -1 {
            return Err(Error::bad_request(
                format!("{f}.parent"),
                format!("must be -1 or an earlier node's index, got {}", node.parent),
            ));
        }
        if node.mask.len() != node.token_ids.len() {
            return Err(Error::bad_request(
                format!("{f}.mask"),
                format!("has {} entries but token_ids has {}", node.mask.len(), node.token_ids.len()),
            ));
        }
        let sampled = node.mask.iter().filter(|m| **m).count();
        if node.logprobs.len() != sampled {
            return Err(Error::bad_request(
                format!("{f}.logprobs"),
                format!("has {} entries but mask marks {sampled} sampled tokens", node.logprobs.len()),
            ));
        }
    }
    Ok(())
}

/// Builds a trace's message graph as an episode goes.
#[derive(Debug, Default)]
pub(crate) struct TraceBuilder {
    pub(crate) nodes: Vec<pb::MessageNode>,
    /// Tokens of the current branch (empty when the endpoint gives no tokens).
    path_tokens: Vec<u32>,
    leaf: Option<usize>,
    /// Messages already in the graph on the current branch.
    committed: usize,
}

impl TraceBuilder {
    /// Records one model turn: `messages` is the whole prompt sent, `prompt_ids` its tokens.
    pub(crate) fn add_turn(&mut self, messages: &[Message], prompt_ids: Option<&[u32]>, choice: &Choice) {
        let extends = match prompt_ids {
            Some(p) => self.leaf.is_some() && p.len() >= self.path_tokens.len() && p.starts_with(&self.path_tokens),
            None => self.leaf.is_some(),
        };
        let (mut parent, new_messages, delta): (i32, &[Message], &[u32]) = if extends {
            let delta = prompt_ids.map_or(&[][..], |p| &p[self.path_tokens.len()..]);
            (self.leaf.map_or(-1, |l| l as i32), &messages[self.committed.min(messages.len())..], delta)
        } else {
            // The prompt does not extend the current branch: start a new one from a fresh root.
            (-1, messages, prompt_ids.unwrap_or(&[]))
        };
        // Input tokens (including the next turn's generation scaffold) go to the last new message.
        let last = new_messages.len().saturating_sub(1);
        for (i, m) in new_messages.iter().enumerate() {
            let mut node = message_node(m, parent);
            if i == last {
                node.token_ids = delta.to_vec();
                node.mask = vec![false; delta.len()];
            }
            self.nodes.push(node);
            parent = (self.nodes.len() - 1) as i32;
        }
        let mut node = message_node(&choice.message, parent);
        node.sampled = true;
        node.finish_reason = choice.finish_reason.clone();
        if let (Some(ids), Some(lps)) = (&choice.token_ids, &choice.logprobs) {
            node.token_ids = ids.clone();
            node.mask = vec![true; ids.len()];
            node.logprobs = lps.clone();
        }
        self.nodes.push(node);
        self.leaf = Some(self.nodes.len() - 1);
        self.committed = messages.len() + 1;
        self.path_tokens = match (prompt_ids, &choice.token_ids) {
            (Some(p), Some(c)) => [p, c.as_slice()].concat(),
            _ => Vec::new(),
        };
    }

    /// Records messages that end the episode without another model turn (final env replies).
    pub(crate) fn add_trailing(&mut self, messages: &[Message]) {
        let mut parent = self.leaf.map_or(-1, |l| l as i32);
        for m in messages {
            self.nodes.push(message_node(m, parent));
            parent = (self.nodes.len() - 1) as i32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(ids: &[u32]) -> Choice {
        Choice {
            message: Message::assistant("x"),
            token_ids: Some(ids.to_vec()),
            logprobs: Some(vec![-0.1; ids.len()]),
            finish_reason: String::from("stop"),
        }
    }

    #[test]
    fn extending_prompts_make_one_branch_and_divergent_ones_fork() {
        let mut b = TraceBuilder::default();
        let mut msgs = vec![Message::system("s"), Message::user("u1")];
        b.add_turn(&msgs, Some(&[1, 2, 3]), &choice(&[4, 5]));
        msgs.push(Message::assistant("x"));
        msgs.push(Message::user("u2"));
        b.add_turn(&msgs, Some(&[1, 2, 3, 4, 5, 6]), &choice(&[7]));
        let trace = pb::Trace { nodes: b.nodes.clone(), ..Default::default() };
        check_trace(&trace, "trace").unwrap();
        let br = branches(&trace);
        assert_eq!(br.len(), 1);
        assert_eq!(br[0].token_ids, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(br[0].mask, [false, false, false, true, true, false, true]);
        assert_eq!(br[0].logprobs[3], -0.1);
        assert_eq!(trace.nodes.len(), 5, "system, user, assistant, user, assistant");

        // A prompt that rewrites history forks a second branch.
        b.add_turn(&msgs, Some(&[1, 2, 9]), &choice(&[8]));
        let trace = pb::Trace { nodes: b.nodes, ..Default::default() };
        let br = branches(&trace);
        assert_eq!(br.len(), 2);
        assert_eq!(br[1].token_ids, [1, 2, 9, 8]);
    }

    #[test]
    fn inconsistent_lengths_name_the_field() {
        let trace = pb::Trace {
            nodes: vec![pb::MessageNode { parent: -1, token_ids: vec![1, 2], mask: vec![true], ..Default::default() }],
            ..Default::default()
        };
        let err = check_trace(&trace, "traces[3]").unwrap_err();
        assert!(err.to_string().contains("traces[3].nodes[0].mask"), "{err}");
    }
}
