//! The page's files, compiled in: nothing to install, nothing fetched at
//! run time, so it works offline and behind a strict Content Security
//! Policy — which it is served with, so a mistake that would need an
//! inline script or style shows up at once in the browser test.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::outbound::response_body::{ResponseBody, full};

/// Only the page's own files may load, and it may only talk to the admin
/// listener it came from; sparklines are drawn as SVG by the page itself.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; \
     base-uri 'none'; form-action 'none'";

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const ASSETS: [Asset; 4] = [
    Asset {
        path: "/ui/",
        content_type: "text/html; charset=utf-8",
        body: include_str!("assets/index.html"),
    },
    Asset {
        path: "/ui/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("assets/app.css"),
    },
    Asset {
        path: "/ui/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("assets/app.js"),
    },
    Asset {
        path: "/ui/favicon.svg",
        content_type: "image/svg+xml",
        body: include_str!("assets/favicon.svg"),
    },
];

/// `/` and `/ui` lead to the page; its links are relative to `/ui/`, so
/// it also works behind a proxy that serves the admin listener under a
/// prefix.
const REDIRECTS: [&str; 2] = ["/", "/ui"];

pub(super) fn serves(path: &str) -> bool {
    REDIRECTS.contains(&path) || ASSETS.iter().any(|a| a.path == path)
}

pub(super) fn get(path: &str) -> Response<ResponseBody> {
    let Some(asset) = ASSETS.iter().find(|a| a.path == path) else {
        let mut r = Response::new(full(Bytes::new()));
        *r.status_mut() = StatusCode::FOUND;
        // Relative: from `/` and from `/ui` alike it resolves to `/ui/`.
        r.headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static("ui/"));
        return r;
    };
    let mut r = Response::new(full(Bytes::from_static(asset.body.as_bytes())));
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Small files that change with the binary: always revalidate.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page must need nothing the policy forbids: no inline script or
    /// style, nothing from another origin.
    #[test]
    fn the_page_needs_nothing_the_policy_forbids() {
        let html = ASSETS[0].body;
        assert!(!html.contains("<style"), "inline style element");
        assert!(!html.contains(" style="), "inline style attribute");
        assert!(!has_event_handler(html), "inline event handler");
        for tag in html.split("<script").skip(1) {
            assert!(tag.contains("src="), "inline script: <script{tag}");
        }
        for asset in &ASSETS {
            // The SVG namespace is a name, not a place anything loads from.
            let body = asset.body.replace("\"http://www.w3.org/2000/svg\"", "");
            for quote in ['"', '\'', '(', '`'] {
                for scheme in ["http:", "https:", "//"] {
                    let url = format!("{quote}{scheme}");
                    assert!(
                        !body.contains(&url),
                        "{} names another origin: {url}",
                        asset.path
                    );
                }
            }
        }
        assert!(
            !ASSETS[2].body.contains("innerHTML"),
            "the script builds DOM nodes, never HTML text"
        );
        assert!(!ASSETS[2].body.contains("eval("));
    }

    /// ` onclick=` and the like.
    fn has_event_handler(html: &str) -> bool {
        html.match_indices(" on").any(|(i, _)| {
            let rest = &html[i + 3..];
            let name = rest.len()
                - rest
                    .trim_start_matches(|c: char| c.is_ascii_lowercase())
                    .len();
            name > 0 && rest[name..].starts_with('=')
        })
    }

    #[test]
    fn paths_are_served_with_their_type_and_the_policy() {
        for asset in &ASSETS {
            assert!(serves(asset.path));
            let r = get(asset.path);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.headers()[header::CONTENT_TYPE], asset.content_type);
            assert_eq!(r.headers()[header::CONTENT_SECURITY_POLICY], CSP);
        }
        for path in REDIRECTS {
            let r = get(path);
            assert_eq!(r.status(), StatusCode::FOUND);
            assert_eq!(r.headers()[header::LOCATION], "ui/");
        }
        assert!(!serves("/ui/other.js"));
        assert!(!serves("/ui/../metrics"));
    }
}
