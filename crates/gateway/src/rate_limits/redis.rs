//! Limits shared by every gateway replica through one Redis. An admission
//! is one round trip: a Lua script runs the same steps as
//! [`super::gcra`] on every key at once, atomically, on Redis's clock (so
//! gateway replicas with skewed clocks agree). Settlements are sent
//! without waiting; the multiplexed connection pipelines them with
//! whatever else is in flight.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::tls::redis::RedisTlsFiles;
use tokio::sync::watch;

use super::gcra::{Cell, Verdict};

/// `KEYS`: one per limit. `ARGV`: interval (ms), tolerance (ms) and cost
/// for each key, in order. Returns `fits` then, per key, remaining units,
/// reset (ms, rounded up) and retry (ms, rounded up; -1 for never).
const CHARGE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local fits = 1
local out = {0}
local new = {}
local function remaining(interval, tolerance, ahead)
  if ahead < 0 then ahead = 0 end
  local r = math.floor((tolerance - ahead) / interval)
  if r < 0 then r = 0 end
  return r
end
for i = 1, #KEYS do
  local interval = tonumber(ARGV[3 * i - 2])
  local tolerance = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  if tat < now then tat = now end
  local increment = cost * interval
  local new_tat = tat + increment
  local over = new_tat - now - tolerance
  -- SLACK: as gcra::SLACK_MS, rounding is no reason to refuse.
  if increment > tolerance + 0.01 then
    fits = 0
    table.insert(out, remaining(interval, tolerance, tat - now))
    table.insert(out, math.ceil(tat - now))
    table.insert(out, -1)
  elseif over > 0.01 then
    fits = 0
    table.insert(out, remaining(interval, tolerance, tat - now))
    table.insert(out, math.ceil(tat - now))
    table.insert(out, math.ceil(over))
  else
    table.insert(out, remaining(interval, tolerance, new_tat - now))
    table.insert(out, math.ceil(new_tat - now))
    table.insert(out, 0)
  end
  new[i] = new_tat
end
if fits == 1 then
  for i = 1, #KEYS do
    redis.call('SET', KEYS[i], string.format('%.3f', new[i]), 'PX', math.ceil(new[i] - now) + 1)
  end
end
out[1] = fits
return out
";

/// `KEYS`: one per limit. `ARGV`: interval (ms) and delta (units, negative
/// to give back) for each key. As [`super::gcra::adjust`].
const ADJUST: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
for i = 1, #KEYS do
  local interval = tonumber(ARGV[2 * i - 1])
  local delta = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i])) or now
  local new_tat
  if delta >= 0 then
    if tat < now then tat = now end
    new_tat = tat + delta * interval
  else
    new_tat = tat + delta * interval
    if new_tat < now then new_tat = now end
  end
  if new_tat > now then
    redis.call('SET', KEYS[i], string.format('%.3f', new_tat), 'PX', math.ceil(new_tat - now) + 1)
  else
    redis.call('DEL', KEYS[i])
  end
end
return 0
";

/// Why Redis gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("not connected to Redis yet")]
    NotConnected,
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A client for `settings.url`: over TLS for `rediss://`, trusting the
/// system's roots or `tls.caFile`, with `tls`'s client certificate.
fn client(settings: &config::Redis, files: Option<RedisTlsFiles>) -> anyhow::Result<redis::Client> {
    if settings.url.starts_with("rediss://") {
        crate::tls::install_process_default();
    }
    let Some(files) = files else {
        return Ok(redis::Client::open(settings.url.as_str())?);
    };
    let certificates = redis::TlsCertificates {
        client_tls: files
            .client
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: files.ca,
    };
    Ok(redis::Client::build_with_tls(
        settings.url.as_str(),
        certificates,
    )?)
}

/// The files `settings.tls` names, as they are now.
fn tls_files(settings: &config::Redis) -> anyhow::Result<Option<RedisTlsFiles>> {
    let Some(tls) = &settings.tls else {
        return Ok(None);
    };
    crate::tls::redis::read(tls).map(Some).map_err(|problems| {
        anyhow::anyhow!(
            "spec.rateLimits.redis.tls: {}",
            crate::tls::FileProblem::joined(&problems)
        )
    })
}

pub struct RedisStore {
    /// The settings and TLS files it was made with: a reload with the same
    /// ones keeps it, so a rotated certificate is used from the next one.
    settings: config::Redis,
    tls_files: Option<RedisTlsFiles>,
    timeout: Duration,
    /// Set by the connecting task once the first connection is up; the
    /// manager reconnects by itself after that.
    connection: watch::Receiver<Option<ConnectionManager>>,
    charge: redis::Script,
    adjust: redis::Script,
    /// Stops the connecting task with the store.
    _connecting: tokio::task::JoinHandle<()>,
}

impl RedisStore {
    /// Starts connecting in the background: the gateway starts (and
    /// answers by `onBackendError`) while Redis is down.
    pub fn new(settings: &config::Redis) -> anyhow::Result<Self> {
        let url = settings.url.as_str();
        let timeout = settings.timeout();
        let tls_files = tls_files(settings)?;
        let client = client(settings, tls_files.clone())?;
        let (slot, connection) = watch::channel(None);
        let shown = redacted(url);
        let connecting = tokio::spawn(async move {
            let mut warned = false;
            loop {
                match client.get_connection_manager().await {
                    Ok(manager) => {
                        let _ = slot.send(Some(manager));
                        tracing::info!(url = %shown, "connected to Redis for rate limits");
                        return;
                    }
                    Err(e) if !warned => {
                        warned = true;
                        tracing::warn!(url = %shown, error = %e, "cannot connect to Redis for rate limits; retrying every second");
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Ok(Self {
            settings: settings.clone(),
            tls_files,
            timeout,
            connection,
            charge: redis::Script::new(CHARGE),
            adjust: redis::Script::new(ADJUST),
            _connecting: connecting,
        })
    }

    /// Whether this store serves `settings` (a reload keeps it; TLS files
    /// are read again only when a setting changes).
    pub fn serves(&self, settings: &config::Redis) -> bool {
        self.settings.url == settings.url
            && self.settings.timeout() == settings.timeout()
            && self.settings.tls == settings.tls
            && tls_files(settings).is_ok_and(|files| files == self.tls_files)
    }

    fn connection(&self) -> Result<ConnectionManager, RedisError> {
        self.connection
            .borrow()
            .clone()
            .ok_or(RedisError::NotConnected)
    }

    /// The connection, waiting up to the timeout for the first one (a
    /// request that arrives while the gateway is still connecting).
    async fn connected(&self) -> Result<ConnectionManager, RedisError> {
        if let Ok(c) = self.connection() {
            return Ok(c);
        }
        let mut waiting = self.connection.clone();
        match tokio::time::timeout(self.timeout, waiting.wait_for(Option::is_some)).await {
            Ok(Ok(c)) => Ok(c.clone().expect("waited for a connection")),
            _ => Err(RedisError::NotConnected),
        }
    }

    pub async fn charge(
        &self,
        keys: &[Arc<str>],
        cells: &[Cell],
        costs: &[f64],
    ) -> Result<(bool, Vec<Verdict>), RedisError> {
        let mut connection = self.connected().await?;
        let mut invocation = self.charge.prepare_invoke();
        for ((key, cell), cost) in keys.iter().zip(cells).zip(costs) {
            invocation
                .key(&**key)
                .arg(cell.interval)
                .arg(cell.tolerance)
                .arg(*cost);
        }
        let answer: Vec<i64> =
            tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection))
                .await
                .map_err(|_| RedisError::Timeout(self.timeout))??;
        let verdicts = answer[1..]
            .chunks_exact(3)
            .map(|v| Verdict {
                remaining: v[0].max(0) as u64,
                reset_ms: v[1] as f64,
                retry_ms: if v[2] < 0 { f64::INFINITY } else { v[2] as f64 },
            })
            .collect::<Vec<_>>();
        if verdicts.len() != keys.len() {
            return Err(RedisError::Redis(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "the limit script answered for another number of keys",
            ))));
        }
        Ok((answer[0] == 1, verdicts))
    }

    /// Sent and forgotten: a settlement that fails leaves the reservation
    /// as it was charged, which errs toward the limit.
    pub fn adjust(&self, keys: Vec<Arc<str>>, cells: Vec<Cell>, deltas: Vec<f64>) {
        let Ok(mut connection) = self.connection() else {
            return;
        };
        let script = self.adjust.clone();
        let timeout = self.timeout * 20;
        tokio::spawn(async move {
            let mut invocation = script.prepare_invoke();
            for ((key, cell), delta) in keys.iter().zip(&cells).zip(&deltas) {
                invocation.key(&**key).arg(cell.interval).arg(*delta);
            }
            let sent =
                tokio::time::timeout(timeout, invocation.invoke_async::<i64>(&mut connection));
            match sent.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "rate-limit settlement failed"),
                Err(_) => tracing::warn!(?timeout, "rate-limit settlement timed out"),
            }
        });
    }
}

/// The URL without its password, for logs and `/debug/config`.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_stay_out_of_logs() {
        assert_eq!(
            super::redacted("redis://:hunter2@redis:6379/0"),
            "redis://***@redis:6379/0"
        );
        assert_eq!(super::redacted("redis://redis:6379"), "redis://redis:6379");
    }
}
