//! nginx as a peer: `least_conn` upstreams over the simulated replicas,
//! streamed through unbuffered, in a config the bench writes to a
//! temporary directory and runs with `nginx -p DIR -c FILE -g 'daemon off;'`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;

/// Where Debian's package installs nginx (not on a non-root `PATH`).
pub const DEBIAN_PATH: &str = "/usr/sbin/nginx";

/// The config file's name inside the run's directory.
pub const CONFIG_FILE: &str = "nginx.conf";

/// `nginx.conf` for a router on `listen` in front of `workers`
/// (`host:port`), keeping every file (pid, logs, temporary bodies) under
/// `dir`. Balancing is `least_conn` with the counts shared between worker
/// processes (the `zone`), as a production config would have it.
pub fn config(listen: SocketAddr, workers: &[String], dir: &Path) -> String {
    let dir = dir.display();
    let mut servers = String::new();
    for worker in workers {
        let _ = writeln!(servers, "        server {worker};");
    }
    format!(
        r#"# Written by `infergate bench` for one run; removed after it.
worker_processes auto;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;

events {{
    worker_connections 8192;
}}

http {{
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    # Long multi-turn prompts are sent whole; keep them in memory.
    client_max_body_size 64m;
    client_body_buffer_size 4m;

    upstream replicas {{
        least_conn;
        zone replicas 256k;
{servers}        keepalive 512;
    }}

    server {{
        listen {listen};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # Stream every token as it comes (SSE).
            proxy_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}
    }}
}}
"#
    )
}

/// The arguments that run nginx in the foreground with the config of
/// [`config`] written to `dir`/[`CONFIG_FILE`].
pub fn args(dir: &Path) -> Vec<String> {
    vec![
        "-p".to_owned(),
        dir.display().to_string(),
        "-c".to_owned(),
        dir.join(CONFIG_FILE).display().to_string(),
        "-g".to_owned(),
        "daemon off;".to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_conn_over_every_worker_streaming_unbuffered() {
        let dir = Path::new("/tmp/run");
        let workers = vec!["127.0.0.1:9001".to_owned(), "127.0.0.1:9002".to_owned()];
        let text = config("127.0.0.1:8000".parse().unwrap(), &workers, dir);
        assert!(text.contains("least_conn;"));
        assert!(text.contains("zone replicas"), "counts shared by workers");
        assert!(text.contains("server 127.0.0.1:9001;"));
        assert!(text.contains("server 127.0.0.1:9002;"));
        assert!(text.contains("listen 127.0.0.1:8000;"));
        assert!(text.contains("proxy_buffering off;"));
        assert!(text.contains("pid /tmp/run/nginx.pid;"));
        // Every path nginx writes is inside the run's directory.
        for line in text
            .lines()
            .filter(|l| l.contains("_path") || l.contains("_log "))
        {
            assert!(
                line.contains("/tmp/run/") || line.contains("access_log off"),
                "{line}"
            );
        }
        // Balanced braces: nginx would refuse the file otherwise.
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert_eq!(
            args(dir),
            [
                "-p",
                "/tmp/run",
                "-c",
                "/tmp/run/nginx.conf",
                "-g",
                "daemon off;"
            ]
        );
    }
}
