//! The policy's weights as its inference servers hold them: which version each replica has
//! loaded, which replicas are in service, which one a group goes to (the least loaded of those
//! holding the current version), and loading every newer complete broadcast the trainer writes,
//! in order, into each of them. A replica that fails a weight update or stops answering is taken
//! out of service; once it answers again it gets the current weights and comes back.

use std::time::{Duration, Instant};

use rl_run::RunDir;
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::models::Models;

/// How often a wait for the trainer's weights says it is still waiting.
const WAIT_WARNING: Duration = Duration::from_secs(60);

/// How often the replicas' `/health` (and `boot_id`) is looked at.
const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// One inference server of the policy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Replica {
    base_url: String,
    /// The version it holds.
    version: u64,
    /// Groups may go to it.
    in_service: bool,
    /// Its `boot_id` when it last got weights (empty: it reports none).
    boot: Option<String>,
    /// Groups running on it now, and sent to it since the last metrics row.
    in_flight: usize,
    groups: usize,
}

/// The version loaded in the policy's inference servers (the trainer step whose weights they
/// serve; 0: the starting weights) and the servers themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PolicyVersion {
    run: RunDir,
    version: u64,
    replicas: Vec<Replica>,
    checked: Option<Instant>,
}

/// The replica a group was sent to (its index); given back with [`PolicyVersion::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease(usize);

impl PolicyVersion {
    /// Tracks `run`'s broadcasts, the servers at `base_urls` holding `version`.
    pub(crate) fn new(run: RunDir, base_urls: &[String], version: u64) -> Self {
        let replicas = base_urls
            .iter()
            .map(|u| Replica { base_url: u.clone(), version, in_service: true, boot: None, in_flight: 0, groups: 0 })
            .collect();
        PolicyVersion { run, version, replicas, checked: None }
    }

    /// The loaded version.
    pub(crate) fn get(&self) -> u64 {
        self.version
    }

    /// The least loaded replica in service that holds the current version (fewest groups in
    /// flight, then fewest sent), or `None` when none does.
    pub(crate) fn lease(&mut self) -> Option<Lease> {
        let version = self.version;
        let (i, r) = self
            .replicas
            .iter_mut()
            .enumerate()
            .filter(|(_, r)| r.in_service && r.version == version)
            .min_by_key(|(i, r)| (r.in_flight, r.groups, *i))?;
        r.in_flight += 1;
        r.groups += 1;
        Some(Lease(i))
    }

    /// The base URL of a leased replica.
    pub(crate) fn base_url(&self, lease: Lease) -> &str {
        &self.replicas[lease.0].base_url
    }

    /// A replica in service with the current weights for a one-off request (scoring), the least
    /// loaded; the first one when none is in service (its error then says what is wrong).
    pub(crate) fn any_base_url(&mut self) -> String {
        match self.lease() {
            Some(l) => {
                self.release(l);
                self.replicas[l.0].groups -= 1;
                self.replicas[l.0].base_url.clone()
            }
            None => self.replicas[0].base_url.clone(),
        }
    }

    /// The group on `lease` finished.
    pub(crate) fn release(&mut self, lease: Lease) {
        let r = &mut self.replicas[lease.0];
        r.in_flight = r.in_flight.saturating_sub(1);
    }

    /// Per replica (by index, with more than one): groups sent since the last call and whether it
    /// is in service (`inference/<i>/groups`, `inference/<i>/in_service`).
    pub(crate) fn take_metrics(&mut self) -> Map<String, Value> {
        let mut out = Map::new();
        if self.replicas.len() > 1 {
            for (i, r) in self.replicas.iter_mut().enumerate() {
                out.insert(format!("inference/{i}/groups"), json!(r.groups));
                out.insert(format!("inference/{i}/in_service"), json!(u8::from(r.in_service)));
                r.groups = 0;
            }
        }
        out
    }

    /// Looks at every replica now (after failed groups, before running them again).
    pub(crate) async fn check_replicas_now(&mut self, models: &Models) -> Result<()> {
        self.checked = None;
        self.check_replicas(models).await
    }

    /// Looks at every replica (at most once per [`HEALTH_CHECK`]): one that does not answer leaves
    /// service; one that restarted (new `boot_id`) or answers again gets the current weights and
    /// is in service. Fails only when no replica is in service afterwards.
    pub(crate) async fn check_replicas(&mut self, models: &Models) -> Result<()> {
        if self.checked.is_some_and(|t| t.elapsed() < HEALTH_CHECK) {
            return Ok(());
        }
        self.checked = Some(Instant::now());
        let (run, version) = (self.run.clone(), self.version);
        let mut last_error = None;
        for (i, r) in self.replicas.iter_mut().enumerate() {
            let Some(boot) = models.policy_health(&r.base_url).await else {
                if r.in_service {
                    tracing::warn!(replica = i, url = %r.base_url, "a policy inference server does not answer; out of service");
                }
                r.in_service = false;
                continue;
            };
            let restarted = r.boot.as_ref().is_some_and(|b| *b != boot);
            if (restarted || !r.in_service || r.version != version) && version > 0 {
                tracing::warn!(
                    replica = i,
                    version,
                    "a policy inference server restarted or came back; loading its weights again"
                );
                if let Err(e) = models.update_weights(&r.base_url, &run.broadcast(version)).await {
                    tracing::warn!(replica = i, error = %e, "could not load its weights; out of service");
                    r.in_service = false;
                    last_error = Some(e);
                    continue;
                }
            }
            (r.boot, r.version, r.in_service) = (Some(boot), version, true);
        }
        match last_error {
            Some(e) if !self.serving() => Err(e),
            _ => Ok(()),
        }
    }

    /// Whether any replica is in service with the current version.
    pub(crate) fn serving(&self) -> bool {
        self.replicas.iter().any(|r| r.in_service && r.version == self.version)
    }

    /// Loads every complete broadcast newer than the loaded version, in order, into each replica
    /// in service; a replica that fails leaves service. Fails when none took a version.
    pub(crate) async fn load_new(&mut self, models: &Models) -> Result<()> {
        self.check_replicas(models).await?;
        while self.run.broadcast_complete(self.version + 1) {
            let next = self.version + 1;
            let dir = self.run.broadcast(next);
            let several = self.replicas.len() > 1;
            let mut last_error = None;
            for (i, r) in self.replicas.iter_mut().enumerate().filter(|(_, r)| r.in_service) {
                match models.update_weights(&r.base_url, &dir).await {
                    Ok(()) => r.version = next,
                    Err(e) if several => {
                        tracing::warn!(replica = i, error = %e, "a policy inference server failed a weight update; out of service");
                        r.in_service = false;
                        last_error = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            if !self.replicas.iter().any(|r| r.in_service && r.version == next) {
                return Err(last_error.unwrap_or_else(|| Error::Policy {
                    url: self.replicas.iter().map(|r| r.base_url.as_str()).collect::<Vec<_>>().join(", "),
                    message: String::from("no inference server is in service to load the new weights"),
                }));
            }
            self.version = next;
            tracing::info!(version = self.version, "policy weights updated");
        }
        Ok(())
    }

    /// Waits until a replica is in service with the current weights, at most `limit`.
    pub(crate) async fn wait_serving(&mut self, models: &Models, limit: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.checked = None;
            match self.check_replicas(models).await {
                Ok(()) if self.serving() => return Ok(()),
                Ok(()) | Err(_) if start.elapsed() <= limit => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(()) => {
                    let urls: Vec<&str> = self.replicas.iter().map(|r| r.base_url.as_str()).collect();
                    return Err(Error::Policy {
                        url: urls.join(", "),
                        message: format!("no policy inference server answered within {:.0}s", limit.as_secs_f64()),
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Loads broadcasts until the version is at least `version`, waiting at most `limit`.
    pub(crate) async fn wait_for(&mut self, models: &Models, version: u64, limit: Duration) -> Result<()> {
        let start = Instant::now();
        let mut next_warning = WAIT_WARNING;
        loop {
            match self.load_new(models).await {
                Ok(()) => {}
                // Every server is down (restarting): keep waiting within the limit.
                Err(e) if start.elapsed() <= limit && !self.any_answers(models).await => {
                    if start.elapsed() >= next_warning {
                        tracing::warn!(error = %e, "the policy's inference servers do not answer; waiting");
                    }
                }
                Err(e) => return Err(e),
            }
            if self.version >= version {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::Checkpoint {
                    path: self.run.broadcast(version).display().to_string(),
                    message: format!(
                        "the trainer did not broadcast these weights within {:.0}s (is it running? see its log)",
                        limit.as_secs_f64()
                    ),
                });
            }
            // Never silent: a stopped or stuck trainer shows up in the log while we wait.
            if start.elapsed() >= next_warning {
                tracing::warn!(
                    waited_s = start.elapsed().as_secs(),
                    "still waiting for the trainer's weights after step {version} ({}); is the trainer running?",
                    self.run.broadcast(version).display()
                );
                next_warning += WAIT_WARNING;
            }
            tokio::time::sleep(rl_run::POLL_INTERVAL).await;
        }
    }

    /// Whether any replica answers `/health`.
    async fn any_answers(&self, models: &Models) -> bool {
        for r in &self.replicas {
            if models.policy_health(&r.base_url).await.is_some() {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> PolicyVersion {
        let urls: Vec<String> = (0..n).map(|i| format!("http://127.0.0.1:{}/v1", 9000 + i)).collect();
        PolicyVersion::new(RunDir::new("/nonexistent"), &urls, 0)
    }

    #[test]
    fn groups_go_to_the_least_loaded_replica_holding_the_current_version() {
        let mut p = pool(3);
        let first: Vec<usize> = (0..3).map(|_| p.lease().unwrap().0).collect();
        assert_eq!(first, [0, 1, 2], "spread before any is reused");
        p.release(Lease(1));
        assert_eq!(p.lease(), Some(Lease(1)), "the one with a free slot");
        // A replica out of service, or behind on weights, gets nothing.
        p.replicas[0].in_service = false;
        p.replicas[2].version = 0;
        p.version = 1;
        p.replicas[1].version = 1;
        assert_eq!((0..4).map(|_| p.lease().unwrap().0).collect::<Vec<_>>(), [1, 1, 1, 1]);
        p.replicas[1].in_service = false;
        assert_eq!(p.lease(), None);
        assert!(!p.serving());
    }

    #[test]
    fn per_replica_metrics_count_groups_since_the_last_row() {
        let mut p = pool(2);
        let a = p.lease().unwrap();
        p.release(a);
        let _ = p.lease();
        let _ = p.lease();
        let m = p.take_metrics();
        assert_eq!((m["inference/0/groups"].clone(), m["inference/1/groups"].clone()), (json!(2), json!(1)));
        assert_eq!(p.take_metrics()["inference/0/groups"], json!(0));
        assert!(pool(1).take_metrics().is_empty(), "one server: no per-replica keys");
    }
}
