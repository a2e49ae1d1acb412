//! Configuration sweeps: a `consts`, `init` or `config` value written `one_of(a, b, ...)` or
//! `lo..=hi` is drawn per case, with the case's dims (`Layer::sweeps`).
//!
//! Bugs of configuration hide in the branches a check never takes: an explicit `head_dim` that is
//! not `hidden / heads`, a soft-cap that is on, a tied LM head. A random draw per case would take
//! every branch eventually, but a check has tens of cases, and with two or three swept fields the
//! product of their values is larger than that. So the cases follow a *plan* first
//! ([`plan`]): every value of every field within the first few cases (as many as the field with the
//! most values has), then every pair of values of two fields (a greedy covering array, as
//! pairwise-testing tools build them), and random draws after the plan; never the whole product.
//! A `lo..=hi` range counts its bounds as its values in the plan and is drawn uniformly after it.
//!
//! Shrinking moves each field towards its first alternative (`one_of`: trying them in order,
//! `lo..=hi`: by halves towards `lo`), so a failure that needs the second branch keeps it and one
//! that does not ends on the first.
//!
//! The plan is followed case by case from a counter the strategy owns (a fresh one per run of the
//! cases): proptest's regression seeds, replayed first, draw their configuration at random from
//! their own seed and do not take a row of the plan, so the declared cases (and the snapshot) are
//! the same whatever the regression file holds. A failing case is re-run exactly with the
//! `GOLDEN_CASE` token its failure prints, which carries the configuration.

use crate::describe::layer::{Layer, Pick, Value};
use proptest::prelude::Rng as _;
use proptest::strategy::{NewTree, Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Most rows a plan has; cases beyond it are drawn at random.
const MAX_ROWS: usize = 256;

/// One swept field as the plan sees it.
#[derive(Clone, Debug)]
struct Field {
    name: String,
    /// How many values it draws from.
    count: usize,
    /// The values the plan covers, as alternative indices: every one of a `one_of`, the bounds of
    /// a range.
    levels: Vec<usize>,
    /// A range (shrunk by halves) rather than a `one_of` (tried in order).
    range: bool,
}

fn fields(layer: &Layer) -> Vec<Field> {
    layer
        .sweeps()
        .into_iter()
        .map(|(name, value)| {
            let count = value.alternatives().max(1);
            let range = matches!(value, Value::Range(..));
            let levels = if range {
                if count > 1 {
                    vec![0, count - 1]
                } else {
                    vec![0]
                }
            } else {
                (0..count).collect()
            };
            Field {
                name: name.to_string(),
                count,
                levels,
                range,
            }
        })
        .collect()
}

/// The plan's rows, as alternative indices per field (in [`Layer::sweeps`]'s order): first every
/// value of every field, in as many rows as the field with the most values has (row `j` takes
/// each field's value `j` modulo its count); then rows that cover the pairs of values of two
/// fields not covered yet, each built greedily (start from an uncovered pair, give every other
/// field the value that covers most uncovered pairs with the fields already set, the first such
/// value on ties). Deterministic.
pub fn plan(layer: &Layer) -> Vec<Vec<usize>> {
    plan_of(&fields(layer))
}

fn plan_of(fields: &[Field]) -> Vec<Vec<usize>> {
    if fields.is_empty() {
        return Vec::new();
    }
    let width = fields.iter().map(|f| f.levels.len()).max().unwrap_or(1);
    let mut rows: Vec<Vec<usize>> = (0..width)
        .map(|j| fields.iter().map(|f| j % f.levels.len()).collect())
        .collect();
    // Pairs of (field, level) not yet together in a row.
    let mut uncovered: Vec<(usize, usize, usize, usize)> = Vec::new();
    for a in 0..fields.len() {
        for b in a + 1..fields.len() {
            for x in 0..fields[a].levels.len() {
                for y in 0..fields[b].levels.len() {
                    uncovered.push((a, x, b, y));
                }
            }
        }
    }
    let covers =
        |row: &[usize], &(a, x, b, y): &(usize, usize, usize, usize)| row[a] == x && row[b] == y;
    uncovered.retain(|p| !rows.iter().any(|r| covers(r, p)));
    while let Some(&(a, x, b, y)) = uncovered.first() {
        if rows.len() >= MAX_ROWS {
            break;
        }
        let mut row: Vec<Option<usize>> = vec![None; fields.len()];
        row[a] = Some(x);
        row[b] = Some(y);
        for f in 0..fields.len() {
            if row[f].is_some() {
                continue;
            }
            let gain = |level: usize| {
                uncovered
                    .iter()
                    .filter(|&&(pa, px, pb, py)| {
                        (pa == f && px == level && row[pb] == Some(py))
                            || (pb == f && py == level && row[pa] == Some(px))
                    })
                    .count()
            };
            let best = (0..fields[f].levels.len())
                .max_by_key(|&l| (gain(l), std::cmp::Reverse(l)))
                .unwrap_or(0);
            row[f] = Some(best);
        }
        let row: Vec<usize> = row.into_iter().map(|l| l.unwrap_or(0)).collect();
        uncovered.retain(|p| !covers(&row, p));
        rows.push(row);
    }
    // Levels to alternative indices.
    rows.into_iter()
        .map(|row| row.iter().zip(fields).map(|(&l, f)| f.levels[l]).collect())
        .collect()
}

/// The strategy of a case's picks: the plan's next row, or after it (and for the `skip` cases
/// proptest replays first from its regression file) a random draw; each field shrinks towards its
/// first alternative.
pub fn strategy(layer: &Layer, skip: usize) -> Sweep {
    let fields = fields(layer);
    Sweep {
        plan: plan_of(&fields),
        fields,
        layer: Arc::new(layer.clone()),
        next: Arc::new(AtomicUsize::new(0)),
        skip,
    }
}

/// See [`strategy`].
#[derive(Clone, Debug)]
pub struct Sweep {
    fields: Vec<Field>,
    plan: Vec<Vec<usize>>,
    layer: Arc<Layer>,
    next: Arc<AtomicUsize>,
    skip: usize,
}

impl Strategy for Sweep {
    type Tree = PicksTree;
    type Value = Vec<Pick>;

    fn new_tree(&self, runner: &mut TestRunner) -> NewTree<Self> {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        let row: Vec<usize> = match k.checked_sub(self.skip).and_then(|i| self.plan.get(i)) {
            Some(row) => row.clone(),
            None => {
                let rng = runner.rng();
                self.fields
                    .iter()
                    .map(|f| (rng.next_u64() % f.count.max(1) as u64) as usize)
                    .collect()
            }
        };
        let trees = row
            .into_iter()
            .zip(&self.fields)
            .map(|(index, f)| {
                if f.range {
                    Index::Range(proptest::num::usize::BinarySearch::new_above(0, index))
                } else {
                    Index::Ordered {
                        accepted: index,
                        current: index,
                        next: 0,
                    }
                }
            })
            .collect();
        Ok(PicksTree {
            trees,
            names: self.fields.iter().map(|f| f.name.clone()).collect(),
            layer: self.layer.clone(),
            shrinker: 0,
            previous: None,
        })
    }
}

/// One field's draw while shrinking.
#[derive(Clone, Debug)]
enum Index {
    /// A `one_of`: smaller alternatives tried in order, from the first.
    Ordered {
        /// The last alternative known to fail.
        accepted: usize,
        /// The alternative being tried.
        current: usize,
        /// The next one to try.
        next: usize,
    },
    /// A range: by halves towards its lower bound.
    Range(proptest::num::usize::BinarySearch),
}

impl Index {
    fn current(&self) -> usize {
        match self {
            Index::Ordered { current, .. } => *current,
            Index::Range(t) => t.current(),
        }
    }

    fn simplify(&mut self) -> bool {
        match self {
            Index::Ordered {
                accepted,
                current,
                next,
            } => {
                *accepted = *current;
                if *next < *accepted {
                    *current = *next;
                    *next += 1;
                    true
                } else {
                    false
                }
            }
            Index::Range(t) => t.simplify(),
        }
    }

    fn complicate(&mut self) -> bool {
        match self {
            Index::Ordered {
                accepted,
                current,
                next,
            } => {
                if *next < *accepted {
                    *current = *next;
                    *next += 1;
                    true
                } else if *current != *accepted {
                    // Back to the one that fails: tested again, it moves shrinking on.
                    *current = *accepted;
                    true
                } else {
                    false
                }
            }
            Index::Range(t) => t.complicate(),
        }
    }
}

/// The value tree of a case's picks: the fields shrink one after the other, as a tuple's elements.
#[derive(Clone, Debug)]
pub struct PicksTree {
    trees: Vec<Index>,
    names: Vec<String>,
    layer: Arc<Layer>,
    shrinker: usize,
    previous: Option<usize>,
}

impl ValueTree for PicksTree {
    type Value = Vec<Pick>;

    fn current(&self) -> Vec<Pick> {
        self.trees
            .iter()
            .zip(&self.names)
            .map(|(t, name)| self.layer.pick(name, t.current()))
            .collect()
    }

    fn simplify(&mut self) -> bool {
        while self.shrinker < self.trees.len() {
            if self.trees[self.shrinker].simplify() {
                self.previous = Some(self.shrinker);
                return true;
            }
            self.shrinker += 1;
        }
        false
    }

    fn complicate(&mut self) -> bool {
        let Some(i) = self.previous else {
            return false;
        };
        if self.trees[i].complicate() {
            self.shrinker = i;
            true
        } else {
            self.previous = None;
            false
        }
    }
}

/// The configurations a run's cases covered, each with how many cases it got, in the order they
/// first came: `softcap=None head_dim=d / h` (no sweeps: nothing).
pub fn covered<'a>(picks: impl IntoIterator<Item = &'a [Pick]>) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for picks in picks {
        if picks.is_empty() {
            continue;
        }
        let name = picks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, count)) => *count += 1,
            None => out.push((name, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::describe::layer::{DimValue, Dist, Layer};
    use proptest::test_runner::{Config, TestError};

    fn layer(fields: &[(&str, Value)]) -> Layer {
        let mut layer = Layer::function("t", "m.f")
            .dim("d", 2, 8)
            .dim("h", 1, 2)
            .arg("x", ["d"], Dist::default());
        for (name, value) in fields {
            layer = layer.konst(name, value.clone());
        }
        layer
    }

    fn two() -> Value {
        Value::one_of([Value::None, 30.0.into()])
    }

    #[test]
    fn the_plan_tries_every_value_first_then_every_pair() {
        let three = Value::one_of([1.into(), 2.into(), 3.into()]);
        let l = layer(&[("a", two()), ("b", three), ("c", Value::Range(1, 9))]);
        let rows = plan(&l);
        assert_eq!(l.cases_for_each_value(), 3);
        // The first three rows try each of a's 2, b's 3 and c's two bounds.
        for (f, count) in [(0, 2), (1, 3)] {
            let seen: std::collections::BTreeSet<usize> = rows[..3].iter().map(|r| r[f]).collect();
            assert_eq!(seen.len(), count, "{rows:?}");
        }
        let bounds: std::collections::BTreeSet<usize> = rows[..3].iter().map(|r| r[2]).collect();
        assert_eq!(bounds, [0, 8].into(), "{rows:?}");
        // Then every pair of two fields' values, in far fewer rows than the product (2·3·2 = 12).
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            for x in 0..3 {
                for y in [0usize, 1, 2, 8] {
                    let possible = |f: usize, v: usize| match f {
                        0 => v < 2,
                        1 => v < 3,
                        _ => v == 0 || v == 8,
                    };
                    if possible(a, x) && possible(b, y) {
                        assert!(
                            rows.iter().any(|r| r[a] == x && r[b] == y),
                            "{a}={x} {b}={y} {rows:?}"
                        );
                    }
                }
            }
        }
        assert!(rows.len() < 12, "{}", rows.len());
        // Three fields of three values: every pair in about nine rows, not the product's 27.
        let three = || Value::one_of([1.into(), 2.into(), 3.into()]);
        let l = layer(&[("a", three()), ("b", three()), ("c", three())]);
        let rows = plan(&l);
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            for x in 0..3 {
                for y in 0..3 {
                    assert!(rows.iter().any(|r| r[a] == x && r[b] == y), "{rows:?}");
                }
            }
        }
        assert!(rows.len() <= 11, "{} rows: {rows:?}", rows.len());
    }

    #[test]
    fn cases_follow_the_plan_and_shrink_to_the_first_alternative() {
        let l = layer(&[("softcap", two()), ("head", Value::Range(1, 16))]);
        let strategy = strategy(&l, 0);
        let mut runner = TestRunner::deterministic();
        let first: Vec<Vec<Pick>> = (0..2)
            .map(|_| strategy.new_tree(&mut runner).unwrap().current())
            .collect();
        assert_eq!(first[0][0].shown, "None");
        assert_eq!(first[1][0].shown, "30.0");
        assert_eq!(
            (first[0][1].shown.as_str(), first[1][1].shown.as_str()),
            ("1", "16")
        );
        // A failure that needs the soft-cap keeps it and brings the range down to its bound.
        let result = TestRunner::new(Config::default()).run(&super::strategy(&l, 0), |picks| {
            if picks[0].index == 1 && picks[1].index >= 3 {
                Err(proptest::test_runner::TestCaseError::fail("capped"))
            } else {
                Ok(())
            }
        });
        let Err(TestError::Fail(_, minimal)) = result else {
            panic!("{result:?}")
        };
        assert_eq!(minimal[0].shown, "30.0");
        assert_eq!(minimal[1].shown, "4");
        // One that does not need it ends on the first alternative.
        let result = TestRunner::new(Config::default()).run(&super::strategy(&l, 0), |picks| {
            if picks[1].index >= 5 {
                Err(proptest::test_runner::TestCaseError::fail("long"))
            } else {
                Ok(())
            }
        });
        let Err(TestError::Fail(_, minimal)) = result else {
            panic!("{result:?}")
        };
        assert_eq!(
            (minimal[0].shown.as_str(), minimal[1].shown.as_str()),
            ("None", "6")
        );
    }

    #[test]
    fn relations_between_dims_are_resolved_per_case() {
        let d = || Box::new(DimValue::dim("d"));
        let h = || Box::new(DimValue::dim("h"));
        let head = Value::one_of([
            Value::Dims(DimValue::Div(d(), h())),
            Value::Dims(DimValue::Div(
                Box::new(DimValue::Mul(Box::new(DimValue::Lit(2)), d())),
                h(),
            )),
        ]);
        let l = layer(&[("head_dim", head)]);
        let dims = [("d".to_string(), 8), ("h".to_string(), 2)];
        let pick = l.pick("head_dim", 1);
        assert_eq!(pick.shown, "2 * d / h");
        assert_eq!(pick.token(), "#1");
        let case = l.for_case(&dims, &[pick]);
        assert_eq!(case.consts[0].1, Value::Int(8));
        assert_eq!(
            l.for_case(&dims, &[l.pick("head_dim", 0)]).consts[0].1,
            Value::Int(4)
        );
        assert_eq!(
            l.description(32, 0)
                .lines()
                .find(|s| s.starts_with("consts"))
                .unwrap(),
            "consts: head_dim = one_of(d / h, 2 * d / h)"
        );
    }

    #[test]
    fn covered_configurations_are_counted() {
        let l = layer(&[("softcap", two())]);
        let a = vec![l.pick("softcap", 0)];
        let b = vec![l.pick("softcap", 1)];
        let all = [a.as_slice(), b.as_slice(), a.as_slice()];
        assert_eq!(
            covered(all),
            vec![
                ("softcap=None".to_string(), 2),
                ("softcap=30.0".to_string(), 1)
            ]
        );
    }
}
