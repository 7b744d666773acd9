//! The one way this workspace builds HTTP clients (model endpoints, weight updates): reqwest over
//! rustls with graviola, a pure-Rust crypto provider (no C toolchain or OpenSSL at build or run
//! time). Certificates are checked against the system's roots (`SSL_CERT_FILE` / `SSL_CERT_DIR`
//! override them, as for most TLS tools) plus any extra roots given here. Plain `http://` needs
//! none of this and works on every CPU.

use std::sync::Once;

/// Installs graviola as the process's rustls provider (once; a provider someone else installed
/// first is kept).
fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::CryptoProvider::install_default(rustls_graviola::default_provider());
    });
}

/// A client builder with TLS set up and `extra_roots` (PEM certificates) trusted besides the
/// system's.
pub fn client_builder(extra_roots: &[reqwest::Certificate]) -> reqwest::ClientBuilder {
    install_provider();
    let mut builder = reqwest::Client::builder();
    for cert in extra_roots {
        builder = builder.add_root_certificate(cert.clone());
    }
    builder
}

/// Whether `https://` URLs can be reached from this CPU: graviola needs AES-NI, PCLMULQDQ, AVX2,
/// BMI1 and ADX on x86-64 (processors from about 2013 on), AES and PMULL on aarch64. The error says
/// which is missing, instead of the provider's panic at the first handshake.
pub fn https_supported() -> Result<(), String> {
    #[cfg(target_arch = "x86_64")]
    {
        let have = [
            ("aes", std::arch::is_x86_feature_detected!("aes")),
            ("pclmulqdq", std::arch::is_x86_feature_detected!("pclmulqdq")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("bmi1", std::arch::is_x86_feature_detected!("bmi1")),
            ("adx", std::arch::is_x86_feature_detected!("adx")),
        ];
        let missing: Vec<&str> = have.iter().filter(|(_, ok)| !ok).map(|(f, _)| *f).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("https:// endpoints need CPU features this machine lacks: {}", missing.join(", ")))
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let ok = std::arch::is_aarch64_feature_detected!("aes") && std::arch::is_aarch64_feature_detected!("pmull");
        if ok { Ok(()) } else { Err(String::from("https:// endpoints need the AES and PMULL CPU extensions")) }
    }
}

/// Checks that `url` can be reached: `http://` always, `https://` when [`https_supported`].
pub fn check_reachable_scheme(url: &str) -> Result<(), String> {
    if url.starts_with("https://") { https_supported() } else { Ok(()) }
}

/// `e` and its causes on one line (reqwest's own message leaves out why a request failed, e.g. the
/// certificate problem behind a TLS failure).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// Whether `e` failed in the TLS layer (an untrusted or mismatched certificate, a handshake the
/// server refused): a configuration problem that retrying cannot fix.
pub fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    // rustls errors reach hyper wrapped in `io::Error`s (sometimes twice), whose `source()` skips
    // the wrapped error: look inside those as well as along the chain.
    let mut pending: Vec<&(dyn std::error::Error + 'static)> = vec![e];
    while let Some(s) = pending.pop() {
        if s.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(inner) = s.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            pending.push(inner);
        }
        pending.extend(s.source());
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_needs_nothing_and_https_is_checked() {
        assert!(check_reachable_scheme("http://127.0.0.1:1/v1").is_ok());
        // This machine (and CI's) has the features; the check itself must not panic.
        let _ = check_reachable_scheme("https://example.com/v1");
        assert!(client_builder(&[]).build().is_ok(), "a client builds with the provider installed");
    }
}
