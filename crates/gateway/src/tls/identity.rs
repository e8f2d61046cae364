//! What a verified client certificate says about its holder, parsed once
//! per connection for whatever identifies callers.

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;

/// The names in a client's certificate, verified against the listener's
/// `clientCaFile` during the handshake. Every request on the connection
/// carries the same one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The subject's common name (the first, when there are several).
    pub common_name: Option<String>,
    /// The DNS names among the subject alternative names, in order.
    pub dns_names: Vec<String>,
}

impl ClientCertificate {
    /// The names of the DER certificate `der`; `None` when it does not
    /// parse (rustls has verified it, so that is not expected).
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = X509Certificate::from_der(der).ok()?;
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let dns_names = match cert.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Some(Self {
            common_name,
            dns_names,
        })
    }
}

/// When the certificate `der` expires, in seconds since the Unix epoch.
pub fn not_after(der: &[u8]) -> Option<i64> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_a_certificate() {
        let mut params =
            rcgen::CertificateParams::new(vec!["a.example".into(), "b.example".into()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tenant-a");
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress([10, 0, 0, 1].into()));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let parsed = ClientCertificate::from_der(cert.der()).unwrap();
        assert_eq!(parsed.common_name.as_deref(), Some("tenant-a"));
        assert_eq!(parsed.dns_names, ["a.example", "b.example"]);
        assert!(not_after(cert.der()).unwrap() > 0);
    }

    #[test]
    fn a_certificate_without_names() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let parsed = ClientCertificate::from_der(cert.der()).unwrap();
        assert_eq!(parsed.common_name, None);
        assert_eq!(parsed.dns_names, Vec::<String>::new());
        assert!(ClientCertificate::from_der(b"not DER").is_none());
    }
}
