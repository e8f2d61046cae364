//! `infergate keys`: API keys for `spec.auth.apiKeys`.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Make a new API key: 32 random bytes from the operating system,
    /// printed once, with the line to add to `spec.auth.apiKeys.keys` or
    /// the keys file. Only the key's SHA-256 is ever configured.
    New {
        /// The tenant the key belongs to.
        #[arg(long)]
        tenant: String,
        /// A name for the key, shown in logs instead of the key.
        #[arg(long)]
        name: Option<String>,
    },
}

pub fn run(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::New { tenant, name } => {
            if let Err(why) = config::tenant_name(&tenant) {
                anyhow::bail!("--tenant {why}");
            }
            let (key, sha256) = gateway::auth::generate_api_key();
            println!("{key}");
            eprintln!(
                "\nThe key above is shown once: give it to the tenant now. Add this line to \
                 spec.auth.apiKeys.keys (or the keys file):\n"
            );
            println!("{}", yaml_line(&tenant, &sha256, name.as_deref()));
            Ok(())
        }
    }
}

/// `- {tenant: "NAME", sha256: HEX}`; strings JSON-quoted, which YAML reads
/// as they are whatever they hold.
fn yaml_line(tenant: &str, sha256: &str, name: Option<&str>) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    match name {
        Some(name) => format!(
            "- {{tenant: {}, sha256: {sha256}, name: {}}}",
            quote(tenant),
            quote(name)
        ),
        None => format!("- {{tenant: {}, sha256: {sha256}}}", quote(tenant)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_reads_back_as_the_key_entry() {
        let line = yaml_line("team: \"a\"", &"ab".repeat(32), Some("ci #1"));
        let keys = config::api_keys_from_yaml(&line).unwrap();
        assert_eq!(keys[0].tenant, "team: \"a\"");
        assert_eq!(keys[0].sha256.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!(keys[0].name.as_deref(), Some("ci #1"));
    }
}
