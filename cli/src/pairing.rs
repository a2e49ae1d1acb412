//! Which file of A goes with which of B: by key (the path inside the folder or archive without
//! the extension, `a/0_attn.npy` with `b/0_attn.pth`), after B's keys go through the name
//! mapping (`mapping.rs`), and with tensor-parallel shards gathered: when one side has `x` and
//! the other only `x.rank0`, `x.rank1`, … (or `x_tp0`, `x.shard_0_of_2`, `x-part1`, or the
//! shards in folders `rank0/x`, `rank1/x`), those shards, in the order of their numbers, pair
//! with `x` and are concatenated before comparing. A set of shards is gathered only whole: their
//! numbers run from 0 without a gap (and up to the `of` count when there is one).

use crate::mapping::Mapping;
use crate::side::Side;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// A file of one side: its own key and its path.
pub type File = (String, PathBuf);

/// Files of A and B that pair: one each, or a side's shards in order.
#[derive(Clone, Debug)]
pub struct FilePair {
    /// The pair's key: A's name (B's, mapped, when only B has it).
    pub key: String,
    /// A's file (or shards); none when only B has it.
    pub a: Vec<File>,
    /// B's file (or shards); none when only A has it.
    pub b: Vec<File>,
    /// The mapping rule that gave B's key its A name, if one did.
    pub rule: Option<String>,
}

/// The markers of a shard's number.
const MARKERS: &[&str] = &["rank", "tp", "shard", "part"];

/// `rank0`, `tp_1`, `shard_0_of_2`, `part-3`: the number and the count, if `s` is exactly that.
fn marker(s: &str) -> Option<(usize, Option<usize>)> {
    let lower = s.to_ascii_lowercase();
    let rest = MARKERS.iter().find_map(|m| lower.strip_prefix(m))?;
    let rest = rest.strip_prefix(['_', '-']).unwrap_or(rest);
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let index: usize = rest[..digits].parse().ok()?;
    let tail = &rest[digits..];
    if tail.is_empty() {
        return Some((index, None));
    }
    let tail = tail.strip_prefix(['_', '-']).unwrap_or(tail);
    let count = tail.strip_prefix("of")?;
    let count = count.strip_prefix(['_', '-']).unwrap_or(count);
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((index, Some(count.parse().ok()?)))
}

/// A shard's base key, number and count: `x.rank1` → (`x`, 1, None), `rank1/x` → (`x`, 1, None),
/// `x_shard_0_of_2` → (`x`, 0, Some(2)).
pub fn shard_of(key: &str) -> Option<(String, usize, Option<usize>)> {
    let parts: Vec<&str> = key.split('/').collect();
    let (last, dirs) = parts.split_last()?;
    // A folder per shard.
    for (i, dir) in dirs.iter().enumerate() {
        if let Some((index, count)) = marker(dir) {
            let mut rest: Vec<&str> = parts.clone();
            rest.remove(i);
            return Some((rest.join("/"), index, count));
        }
    }
    // A suffix: the last separator before a marker.
    for (at, c) in last.char_indices().rev() {
        if !matches!(c, '.' | '_' | '-') || at == 0 {
            continue;
        }
        if let Some((index, count)) = marker(&last[at + 1..]) {
            let mut base: Vec<&str> = dirs.to_vec();
            base.push(&last[..at]);
            return Some((base.join("/"), index, count));
        }
    }
    None
}

/// Shards of one side whose base the other side has and this one does not: base → files in order.
fn gather_shards(
    own: &[(String, File)],
    other: &HashMap<String, usize>,
) -> HashMap<String, Vec<usize>> {
    let own_keys: HashMap<&str, usize> = own
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.as_str(), i))
        .collect();
    let mut groups: BTreeMap<String, Vec<(usize, Option<usize>, usize)>> = BTreeMap::new();
    for (i, (key, _)) in own.iter().enumerate() {
        if other.contains_key(key) {
            continue;
        }
        if let Some((base, index, count)) = shard_of(key) {
            if other.contains_key(&base) && !own_keys.contains_key(base.as_str()) {
                groups.entry(base).or_default().push((index, count, i));
            }
        }
    }
    let mut out = HashMap::new();
    for (base, mut shards) in groups {
        shards.sort_by_key(|s| s.0);
        let n = shards.len();
        let whole = n >= 2
            && shards.iter().enumerate().all(|(k, s)| s.0 == k)
            && shards.iter().all(|s| s.1.is_none_or(|c| c == n));
        if whole {
            out.insert(base, shards.into_iter().map(|s| s.2).collect());
        }
    }
    out
}

/// Pair the files of two sides that are folders (or archives).
pub fn pair(a: &Side, b: &Side, mapping: &Mapping) -> Vec<FilePair> {
    // Each side's files under the key they pair by: B's mapped to A's names.
    let fa: Vec<(String, File)> = a
        .files
        .iter()
        .map(|(k, p)| (k.clone(), (k.clone(), p.clone())))
        .collect();
    let mut rules: HashMap<String, String> = HashMap::new();
    let fb: Vec<(String, File)> = b
        .files
        .iter()
        .map(|(k, p)| {
            let key = match mapping.to_a(k) {
                Some(mapped) => {
                    if let Some(rule) = mapping.rule_for(k) {
                        rules.insert(k.clone(), rule);
                    }
                    mapped
                }
                None => k.clone(),
            };
            (key, (k.clone(), p.clone()))
        })
        .collect();
    let index = |files: &[(String, File)]| -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for (i, (k, _)) in files.iter().enumerate() {
            m.entry(k.clone()).or_insert(i);
        }
        m
    };
    let (ia, ib) = (index(&fa), index(&fb));
    let (sa, sb) = (gather_shards(&fa, &ib), gather_shards(&fb, &ia));
    let in_shards = |groups: &HashMap<String, Vec<usize>>| -> Vec<bool> {
        let mut v = vec![false; groups.values().flatten().max().map_or(0, |m| m + 1)];
        for &i in groups.values().flatten() {
            v[i] = true;
        }
        v
    };
    let (shard_a, shard_b) = (in_shards(&sa), in_shards(&sb));
    let is = |v: &[bool], i: usize| v.get(i).copied().unwrap_or(false);
    let rule_of = |files: &[File]| files.iter().find_map(|(k, _)| rules.get(k).cloned());
    let mut pairs = Vec::new();
    let mut used_b = vec![false; fb.len()];
    let mut seen_a: HashMap<&str, ()> = HashMap::new();
    for (i, (key, file)) in fa.iter().enumerate() {
        if is(&shard_a, i) || seen_a.insert(key.as_str(), ()).is_some() {
            continue;
        }
        let b_files: Vec<File> = if let Some(group) = sb.get(key) {
            group
                .iter()
                .map(|&j| {
                    used_b[j] = true;
                    fb[j].1.clone()
                })
                .collect()
        } else if let Some(&j) = ib.get(key) {
            used_b[j] = true;
            vec![fb[j].1.clone()]
        } else {
            Vec::new()
        };
        pairs.push(FilePair {
            key: key.clone(),
            a: vec![file.clone()],
            rule: rule_of(&b_files),
            b: b_files,
        });
    }
    // A's shards of a name B has whole.
    for (base, group) in &sa {
        let j = ib[base];
        used_b[j] = true;
        pairs.push(FilePair {
            key: base.clone(),
            a: group.iter().map(|&i| fa[i].1.clone()).collect(),
            b: vec![fb[j].1.clone()],
            rule: rule_of(std::slice::from_ref(&fb[j].1)),
        });
    }
    for (j, (key, file)) in fb.iter().enumerate() {
        if used_b[j] || is(&shard_b, j) {
            continue;
        }
        used_b[j] = true;
        pairs.push(FilePair {
            key: key.clone(),
            a: Vec::new(),
            b: vec![file.clone()],
            rule: rules.get(&file.0).cloned(),
        });
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_give_their_base_and_number() {
        for (key, want) in [
            ("3_post_mlp.rank1", Some(("3_post_mlp", 1, None))),
            ("3_post_mlp_tp0", Some(("3_post_mlp", 0, None))),
            ("x.shard_0_of_2", Some(("x", 0, Some(2)))),
            ("x-shard1of2", Some(("x", 1, Some(2)))),
            ("d/x_part-3", Some(("d/x", 3, None))),
            ("rank1/3_post_mlp", Some(("3_post_mlp", 1, None))),
            ("dumps/tp_0/a/x", Some(("dumps/a/x", 0, None))),
            ("3_post_mlp", None),
            ("layers.0.output", None),
            ("x.rank", None),
            ("x.ranking1", None),
        ] {
            let got = shard_of(key);
            let want = want.map(|(b, i, c)| (b.to_string(), i, c));
            assert_eq!(got, want, "{key}");
        }
    }
}
