//! Names golden did not choose — a check's name, a reference's output keys and state_dict names,
//! a golden store's leaves — become file names one way, everywhere ([`file_name`]): the results
//! file, the golden store, the snapshot, the failure's artifacts and traces. None can name a path.

/// Longest file name stem golden writes, in bytes (file systems allow 255, and `.npy` follows).
pub const MAX_STEM: usize = 200;

/// A name (a leaf, an input, a state_dict entry, a trace point) as one file name inside a folder,
/// readable and never a path: `%`, `/`, `\`, control characters and the characters Windows
/// refuses (`:*?"<>|`) are percent-escaped (`out.a/b` → `out.a%2Fb`); a name of only dots has its
/// dots escaped (`..` → `%2E%2E`), the empty name is `%`; a name too long for a file system is
/// cut and ends with a hash of the whole. Different names give different file names.
pub fn file_name(name: &str) -> String {
    let escape = |c: char| {
        matches!(
            c,
            '%' | '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|'
        ) || c.is_control()
    };
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if escape(c) || (c == '.' && name.chars().all(|d| d == '.')) {
            let mut utf8 = [0; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    if out.is_empty() {
        // No other name gives a lone `%` (a `%` of a name is `%25`).
        return "%".to_string();
    }
    if out.len() > MAX_STEM {
        let mut cut = MAX_STEM - 17;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out = format!(
            "{}~{:016x}",
            &out[..cut],
            crate::describe::hash::fnv1a(name.as_bytes())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn names_become_one_readable_file_name_never_a_path() {
        assert_eq!(file_name("fc1.weight"), "fc1.weight");
        assert_eq!(file_name("trace.blocks.2.attn#2"), "trace.blocks.2.attn#2");
        assert_eq!(file_name("out.../escaped"), "out...%2Fescaped");
        assert_eq!(file_name("/tmp/x"), "%2Ftmp%2Fx");
        assert_eq!(file_name("a\\b\0c%d"), "a%5Cb%00c%25d");
        assert_eq!(file_name(".."), "%2E%2E");
        assert_eq!(file_name(""), "%");
        let long = "é".repeat(300);
        let cut = file_name(&long);
        assert!(cut.len() <= MAX_STEM && cut.contains('~'), "{cut}");
        assert_ne!(cut, file_name(&format!("{long}x")));
        for name in ["../../x", "/abs", "a/../../b", "..", "C:\\x"] {
            let file = file_name(name);
            let path = Path::new("dir").join(format!("{file}.npy"));
            assert_eq!(path.parent(), Some(Path::new("dir")), "{name} -> {file}");
        }
    }
}
