//! What the command line's tests share: real PyTorch dumps in seed 002's layout, archived.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A temporary folder, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("golden-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes two models' dumps with torch.save, as seed 002 describes them, and archives them.
///
/// Six layers, five stages each (`{layer}_post_ln_pre_attn.pth` … `{layer}_post_mlp.pth`), every
/// tensor of A shaped [1, 4, 12, 8] (batch, heads, tokens, head_dim); a scalar `0_sliding.pth`
/// (a Python int), `0_extras.pth` (a dict of two tensors and a list of one) and `meta.pth` (a dict
/// of strings: no tensor). B is the same model dumped by a tensor-parallel port: its attention
/// outputs are [12, 4, 8] (tokens, heads, head_dim: the batch squeezed, heads and tokens swapped),
/// its `post_mlp` in two shards along head_dim (`{layer}_post_mlp.rank0.pth`, `.rank1.pth`, each
/// [12, 4, 4]), the rest as A's; and one planted difference: layer 4's `post_mlp`, A's element
/// [0, 2, 5, 7], is 0.5 larger in B.
///
/// Returns (A's folder, B's folder). Archives are made next to them by `archive`.
pub const MAKE_DUMPS: &str = r#"
import os, sys, torch
root = sys.argv[1]
a, b = os.path.join(root, "a"), os.path.join(root, "b")
os.makedirs(a); os.makedirs(b)
stages = ["post_ln_pre_attn", "post_attn", "post_attn_pre_resid", "pre_mlp", "post_mlp"]
g = torch.Generator().manual_seed(0)
for layer in range(6):
    for stage in stages:
        t = torch.randn(1, 4, 12, 8, generator=g)
        torch.save(t, os.path.join(a, f"{layer}_{stage}.pth"))
        if stage == "post_mlp":
            u = t.clone()
            if layer == 4:
                u[0, 2, 5, 7] += 0.5
            u = u.squeeze(0).permute(1, 0, 2).contiguous()  # [12, 4, 8]
            torch.save(u[..., :4].clone(), os.path.join(b, f"{layer}_post_mlp.rank0.pth"))
            torch.save(u[..., 4:].clone(), os.path.join(b, f"{layer}_post_mlp.rank1.pth"))
        elif stage in ("post_attn", "post_attn_pre_resid"):
            torch.save(t.squeeze(0).permute(1, 0, 2).contiguous(), os.path.join(b, f"{layer}_{stage}.pth"))
        else:
            torch.save(t.clone(), os.path.join(b, f"{layer}_{stage}.pth"))
for d in (a, b):
    torch.save(1, os.path.join(d, "0_sliding.pth"))
    torch.save({"k": torch.arange(6.0).reshape(2, 3), "v": [torch.ones(2)]}, os.path.join(d, "0_extras.pth"))
    torch.save({"model": "tiny", "note": "no tensor here"}, os.path.join(d, "meta.pth"))
"#;

/// Python with torch (golden's venv, or GOLDEN_PYTHON): the tests need real PyTorch.
pub fn python() -> PathBuf {
    golden::internal::describe::env::python().program
}

/// Run a Python script with arguments; panics with its stderr if it fails.
pub fn run_python(script: &str, args: &[&Path]) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python runs (this test needs golden's venv with torch: cargo xtask setup)");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Make the dumps under `root` (see [`MAKE_DUMPS`]): returns A's and B's folders.
pub fn make_dumps(root: &Path) -> (PathBuf, PathBuf) {
    run_python(MAKE_DUMPS, &[root]);
    (root.join("a"), root.join("b"))
}

/// Archive a folder's files as `.zip`, `.tar` or `.tar.gz` (by the extension of `out`), with
/// Python's zipfile and tarfile, inside a top folder named after the archive (`model_a.zip`
/// holds `model_a/0_post_attn.pth`, …), as zipping a folder does.
pub fn archive(folder: &Path, out: &Path) {
    run_python(
        r#"
import os, sys, tarfile, zipfile
folder, out = sys.argv[1], sys.argv[2]
names = sorted(os.listdir(folder))
top = os.path.basename(out).split(".")[0] + "/"
if out.endswith(".zip"):
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n in names:
            z.write(os.path.join(folder, n), top + n)
else:
    mode = "w:gz" if out.endswith((".gz", ".tgz")) else "w"
    with tarfile.open(out, mode) as t:
        for n in names:
            t.add(os.path.join(folder, n), top + n)
"#,
        &[folder, out],
    );
}

/// A `golden view` server this test started (ended on drop if still running).
pub struct Server {
    pub child: std::process::Child,
    pub port: u16,
    /// The address it printed, with its launch's token.
    pub printed: String,
    /// The launch's token (from the printed address), sent with every request of [`Server::get`]
    /// and [`Server::post`].
    pub token: Option<String>,
}

impl Server {
    /// Start `golden view` with `args`, its temporary files in `tmp`; wait for its address.
    pub fn start(args: &[&str], tmp: &Path) -> Server {
        use std::io::BufRead as _;
        let mut child = Command::new(env!("CARGO_BIN_EXE_golden"))
            .arg("view")
            .args(args)
            .env("TMPDIR", tmp)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("golden view starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(120)) else {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "golden view printed no address: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        };
        let printed = line
            .strip_prefix("golden view: ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address: {line}"))
            .to_string();
        let rest = printed
            .strip_prefix("http://127.0.0.1:")
            .unwrap_or_else(|| panic!("not the loopback address: {line}"));
        let port = rest.split('/').next().unwrap().parse().unwrap();
        let token = printed.split_once("?token=").map(|(_, t)| t.to_string());
        Server {
            child,
            port,
            printed,
            token,
        }
    }

    /// The address it printed (with its token).
    pub fn url(&self) -> String {
        self.printed.clone()
    }

    /// Send raw bytes, read the whole answer: (status, body).
    pub fn raw(&self, request: &[u8]) -> (u16, String) {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(120)))
            .unwrap();
        s.write_all(request).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    /// The headers a request of the page itself carries: its host and the launch's token.
    pub fn headers(&self) -> String {
        let mut h = format!("Host: 127.0.0.1:{}\r\n", self.port);
        if let Some(t) = &self.token {
            h.push_str(&format!("X-Golden-Token: {t}\r\n"));
        }
        h
    }

    /// A GET with `headers` (each ended by `\r\n`) and nothing else.
    pub fn get_with(&self, path: &str, headers: &str) -> (u16, String) {
        self.raw(format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n").as_bytes())
    }

    /// A POST of `body` with `headers` (each ended by `\r\n`) and nothing else.
    pub fn post_with(&self, path: &str, headers: &str, body: &[u8]) -> (u16, String) {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\n{headers}Connection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.raw(&request)
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        self.get_with(path, &self.headers())
    }

    pub fn post(&self, path: &str, body: &[u8]) -> (u16, String) {
        self.post_with(path, &self.headers(), body)
    }

    /// The state, once the comparison is no longer running.
    pub fn settled_state(&self) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        loop {
            let (status, body) = self.get("/api/state");
            assert_eq!(status, 200, "{body}");
            let state: serde_json::Value = serde_json::from_str(&body).unwrap();
            if state["status"] != "comparing" {
                return state;
            }
            assert!(std::time::Instant::now() < deadline, "still comparing");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// Stop it as Ctrl-C does; its exit status.
    pub fn interrupt(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-INT", &pid]).status().unwrap();
        let status = self.child.wait().unwrap();
        std::mem::forget(self);
        status
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
