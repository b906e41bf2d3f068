//! `trapctl -p PID attach --json` and `detach --json` (issue 28): one JSON object each with
//! `"schema": 1` first, as every other verb prints, and the process verbs' `list --json` and
//! `splice --json` under the same convention. The process is a `sleep` (any dynamically linked
//! program will do: the agent is loaded by its dlopen).

mod attach_common;

use std::process::{Child, Command};

use attach_common::{text, trapctl};
use serde_json::Value;

struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `trapctl ARGS`' stdout as one JSON object whose first key is `"schema": 1`.
fn json_of(args: &[&str]) -> Value {
    let o = trapctl(args);
    assert!(o.status.success(), "{args:?}: {}", text(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.starts_with("{\n  \"schema\": 1,\n"),
        "{args:?}: the schema first: {stdout}"
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
}

#[test]
fn attach_and_detach_print_one_json_object_with_the_schema_first() {
    let sleeper = Sleeper(Command::new("sleep").arg("60").spawn().unwrap());
    // Let it reach its nanosleep (its loader done).
    std::thread::sleep(std::time::Duration::from_millis(200));
    let pid = sleeper.0.id().to_string();
    let pid_n = u64::from(sleeper.0.id());

    let v = json_of(&["-p", &pid, "attach", "--json"]);
    assert_eq!(v["pid"], pid_n, "{v}");
    assert_eq!(v["attached"], true, "{v}");
    let socket = v["socket"].as_str().unwrap().to_string();
    assert!(std::path::Path::new(&socket).exists(), "{v}");
    let v = json_of(&["-p", &pid, "attach", "--json"]);
    assert_eq!(v["attached"], false, "an agent already listened: {v}");
    assert_eq!(v["socket"], socket.as_str());

    let v = json_of(&["-p", &pid, "list", "--json"]);
    assert_eq!(v["splices"], serde_json::json!([]), "{v}");

    let v = json_of(&["-p", &pid, "detach", "--json"]);
    assert_eq!(v["pid"], pid_n, "{v}");
    assert_eq!(v["unspliced"], 0, "{v}");
    assert!(
        !std::path::Path::new(&socket).exists(),
        "the socket is gone"
    );
}
