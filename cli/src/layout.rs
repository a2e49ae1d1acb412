//! How B's elements line up with A's when the two shapes differ: the explanations a porter tries.
//!
//! * the same elements in the same order in another shape: unit axes added or removed
//!   (`B.unsqueeze(0)`), an axis split or merged (`[76, 512]` against `[76, 8, 64]`);
//! * a permutation of the axes, alone or with the above (`[1, 8, 76, 64]` against `[76, 8, 64]`
//!   is `B.permute(1, 0, 2).unsqueeze(0)`);
//! * tensor-parallel shards of B concatenated along one axis first ([`concat()`]).
//!
//! A [`Layout`] reads B's elements in A's order without copying B: A's element at flat index `i`
//! is B's at `Σ index_k · strides_k`, `index` being `i` unravelled in [`Layout::dims`]. The
//! candidates come in the order a porter would try them (no permutation, then fewer axes moved
//! first), each stated as the PyTorch expression that makes A's shape out of B.

use golden_files::HostTensor;

/// Most candidate layouts tried for one pair.
pub const MAX_CANDIDATES: usize = 64;

/// Most axes (other than unit axes) whose permutations are tried: 6! = 720 orders.
const MAX_PERMUTED_AXES: usize = 6;

/// B's elements read in A's order.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// The sizes walked, in A's order (unit axes dropped, contiguous runs merged).
    pub dims: Vec<usize>,
    /// B's element strides for each of `dims`.
    pub strides: Vec<usize>,
    /// The expression that makes A's shape out of B (`B.permute(1, 0, 2).unsqueeze(0)`).
    pub text: String,
}

/// Sizes walked and B's strides for each.
type Walk = (Vec<usize>, Vec<usize>);

fn c_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for k in (0..shape.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1] * shape[k + 1];
    }
    s
}

fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// Whether `coarse` is `fine` with runs of consecutive axes multiplied together.
fn merges(fine: &[usize], coarse: &[usize]) -> bool {
    let mut it = fine.iter();
    for &c in coarse {
        let mut product = 1usize;
        while product < c {
            match it.next() {
                Some(&f) => product = product.saturating_mul(f),
                None => return false,
            }
        }
        if product != c {
            return false;
        }
    }
    it.next().is_none()
}

/// Every order of `0..n`, fewest axes moved first, then lexicographically.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    fn all(prefix: &mut Vec<usize>, left: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if left.is_empty() {
            out.push(prefix.clone());
            return;
        }
        for i in 0..left.len() {
            let x = left.remove(i);
            prefix.push(x);
            all(prefix, left, out);
            prefix.pop();
            left.insert(i, x);
        }
    }
    let mut out = Vec::new();
    all(&mut Vec::new(), &mut (0..n).collect(), &mut out);
    out.sort_by_key(|p| p.iter().enumerate().filter(|(i, x)| i != *x).count());
    out
}

fn dims_text(d: &[usize]) -> String {
    d.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `.squeeze(k)` / `.squeeze()` / `.unsqueeze(k)` / `.reshape(...)`: from one shape to another of
/// the same elements in the same order; nothing when they are equal.
fn reshape_text(from: &[usize], to: &[usize]) -> String {
    if from == to {
        return String::new();
    }
    let units = |s: &[usize]| s.iter().filter(|&&d| d == 1).count();
    if squeezed(from) == to {
        return match from.iter().position(|&d| d == 1) {
            Some(k) if units(from) == 1 => format!(".squeeze({k})"),
            _ => ".squeeze()".into(),
        };
    }
    if to.len() == from.len() + 1 {
        for k in 0..to.len() {
            if to[k] == 1 && to[..k] == from[..k] && to[k + 1..] == from[k..] {
                return format!(".unsqueeze({k})");
            }
        }
    }
    format!(".reshape({})", dims_text(to))
}

/// Drop unit axes and merge axes that are contiguous in B.
fn canonical(dims: Vec<usize>, strides: Vec<usize>) -> Walk {
    let (mut d, mut s): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (x, y) in dims.into_iter().zip(strides) {
        if x == 1 {
            continue;
        }
        if let Some(&ls) = s.last() {
            if ls == y * x {
                *d.last_mut().unwrap() *= x;
                *s.last_mut().unwrap() = y;
                continue;
            }
        }
        d.push(x);
        s.push(y);
    }
    (d, s)
}

/// The layouts under which B (shape `b`) may hold A's (shape `a`) elements, in the order to try
/// them; none when the element counts differ, and at most [`MAX_CANDIDATES`].
pub fn candidates(a: &[usize], b: &[usize]) -> Vec<Layout> {
    let numel = |s: &[usize]| s.iter().try_fold(1usize, |n, d| n.checked_mul(*d));
    if numel(a) != numel(b) || numel(a).is_none() || a == b {
        return Vec::new();
    }
    let (sa, sb) = (squeezed(a), squeezed(b));
    // (axes moved, layout): B's axes as runs of A's axes in some order, or A's as runs of B's.
    let mut found: Vec<(usize, Walk, String)> = Vec::new();
    let moved = |p: &[usize]| p.iter().enumerate().filter(|(i, x)| i != *x).count();
    if sa.len() <= MAX_PERMUTED_AXES {
        for p in permutations(sa.len()) {
            // B = X.permute(...) where X has A's axes in the order p: B's axes are runs of them.
            let seq: Vec<usize> = p.iter().map(|&i| sa[i]).collect();
            if !merges(&seq, &sb) {
                continue;
            }
            let st = c_strides(&seq);
            let mut inverse = vec![0; p.len()];
            for (j, &i) in p.iter().enumerate() {
                inverse[i] = j;
            }
            let strides: Vec<usize> = inverse.iter().map(|&j| st[j]).collect();
            let mut text = format!("B{}", reshape_text(b, &seq));
            if moved(&p) > 0 {
                text.push_str(&format!(".permute({})", dims_text(&inverse)));
            }
            text.push_str(&reshape_text(&sa, a));
            found.push((moved(&p), canonical(sa.clone(), strides), text));
        }
    }
    if sb.len() <= MAX_PERMUTED_AXES {
        let st = c_strides(&sb);
        for p in permutations(sb.len()) {
            // A's axes are runs of B's axes taken in the order p.
            let seq: Vec<usize> = p.iter().map(|&j| sb[j]).collect();
            if !merges(&seq, &sa) {
                continue;
            }
            let strides: Vec<usize> = p.iter().map(|&j| st[j]).collect();
            let mut text = format!("B{}", reshape_text(b, &sb));
            if moved(&p) > 0 {
                text.push_str(&format!(".permute({})", dims_text(&p)));
            }
            text.push_str(&reshape_text(&seq, a));
            found.push((moved(&p), canonical(seq, strides), text));
        }
    }
    found.sort_by_key(|(m, _, _)| *m);
    let mut out: Vec<Layout> = Vec::new();
    for (_, (dims, strides), text) in found {
        if out.iter().any(|l| l.dims == dims && l.strides == strides) {
            continue;
        }
        out.push(Layout {
            dims,
            strides,
            text,
        });
        if out.len() == MAX_CANDIDATES {
            break;
        }
    }
    out
}

impl Layout {
    /// B's flat index of A's element `i`.
    pub fn offset(&self, mut i: usize) -> usize {
        let mut at = 0;
        for (d, s) in self.dims.iter().zip(&self.strides).rev() {
            at += (i % d) * s;
            i /= d;
        }
        at
    }

    /// A's elements `start..start + len`, read from B: a tensor of B's dtype.
    pub fn gather(&self, b: &HostTensor, start: usize, len: usize) -> HostTensor {
        let size = b.dtype.size();
        let mut data = Vec::with_capacity(len * size);
        if len > 0 && self.dims.is_empty() {
            // Every axis a unit axis: one element.
            data.extend_from_slice(&b.data[..size]);
        } else if len > 0 {
            let n = self.dims.len();
            let mut index = vec![0usize; n];
            let mut rest = start;
            for k in (0..n).rev() {
                index[k] = rest % self.dims[k];
                rest /= self.dims[k];
            }
            let (inner, inner_stride) = (self.dims[n - 1], self.strides[n - 1]);
            let mut left = len;
            while left > 0 {
                let base: usize = index[..n - 1]
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum();
                let run = (inner - index[n - 1]).min(left);
                let first = base + index[n - 1] * inner_stride;
                if inner_stride == 1 {
                    data.extend_from_slice(&b.data[first * size..(first + run) * size]);
                } else {
                    for k in 0..run {
                        let at = (first + k * inner_stride) * size;
                        data.extend_from_slice(&b.data[at..at + size]);
                    }
                }
                left -= run;
                index[n - 1] = 0;
                for k in (0..n - 1).rev() {
                    index[k] += 1;
                    if index[k] < self.dims[k] {
                        break;
                    }
                    index[k] = 0;
                }
            }
        }
        HostTensor {
            dtype: b.dtype,
            shape: vec![len],
            data: data.into(),
        }
    }
}

/// The shards concatenated along `axis` (all of one dtype and rank, equal but along `axis`).
pub fn concat(parts: &[HostTensor], axis: usize) -> HostTensor {
    let first = &parts[0];
    let size = first.dtype.size();
    let outer: usize = first.shape[..axis].iter().product();
    let inner: usize = first.shape[axis + 1..].iter().product();
    let mut shape = first.shape.clone();
    shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
    for o in 0..outer {
        for p in parts {
            let block = p.shape[axis] * inner * size;
            data.extend_from_slice(&p.data[o * block..(o + 1) * block]);
        }
    }
    HostTensor {
        dtype: first.dtype,
        shape,
        data: data.into(),
    }
}

/// The axes along which the shards (shapes) may be concatenated: same rank, equal but along it.
pub fn concat_axes(shapes: &[Vec<usize>]) -> Vec<usize> {
    let Some(first) = shapes.first() else {
        return Vec::new();
    };
    (0..first.len())
        .filter(|&axis| {
            shapes.iter().all(|s| {
                s.len() == first.len()
                    && s.iter()
                        .zip(first)
                        .enumerate()
                        .all(|(k, (x, y))| k == axis || x == y)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize]) -> HostTensor {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|i| i as f64).collect();
        HostTensor::from_f64(shape.to_vec(), &v)
    }

    fn read(l: &Layout, b: &HostTensor) -> Vec<f64> {
        let n: usize = l.dims.iter().product();
        l.gather(b, 0, n).to_f64()
    }

    #[test]
    fn a_squeeze_and_permute_is_found_and_stated() {
        // A [1, 8, 76, 64] (batch, heads, tokens, dim); B [76, 8, 64] (tokens, heads, dim).
        let c = candidates(&[1, 8, 76, 64], &[76, 8, 64]);
        let texts: Vec<&str> = c.iter().map(|l| l.text.as_str()).collect();
        assert!(
            texts.contains(&"B.permute(1, 0, 2).unsqueeze(0)"),
            "{texts:?}"
        );
        let l = c
            .iter()
            .find(|l| l.text == "B.permute(1, 0, 2).unsqueeze(0)")
            .unwrap();
        // A[0, h, t, d] = B[t, h, d].
        let b = t(&[76, 8, 64]);
        let got = read(l, &b);
        for (h, tk, d) in [(0, 0, 0), (3, 70, 5), (7, 75, 63)] {
            let i = (h * 76 + tk) * 64 + d;
            assert_eq!(got[i], ((tk * 8 + h) * 64 + d) as f64);
            assert_eq!(l.offset(i), (tk * 8 + h) * 64 + d);
        }
    }

    #[test]
    fn same_order_comes_first_then_transposes() {
        let c = candidates(&[4, 4], &[16]);
        assert_eq!(c[0].text, "B.reshape(4, 4)");
        assert_eq!(read(&c[0], &t(&[16])), t(&[16]).to_f64());
        assert_eq!(c[1].text, "B.reshape(4, 4).permute(1, 0)");
        assert_eq!(read(&c[1], &t(&[16]))[1], 4.0);
        let c = candidates(&[16], &[4, 4]);
        assert_eq!(c[0].text, "B.reshape(16)");
        assert_eq!(c[1].text, "B.permute(1, 0).reshape(16)");
        assert_eq!(candidates(&[1, 8], &[8])[0].text, "B.unsqueeze(0)");
        assert_eq!(candidates(&[8], &[1, 8, 1])[0].text, "B.squeeze()");
        assert_eq!(
            candidates(&[76, 512], &[76, 8, 64])[0].text,
            "B.reshape(76, 512)"
        );
        // Heads split and moved: A [8, 76, 64] from B [76, 512].
        let c = candidates(&[8, 76, 64], &[76, 512]);
        assert!(c
            .iter()
            .any(|l| l.text == "B.reshape(76, 8, 64).permute(1, 0, 2)"));
        assert!(candidates(&[3, 4], &[13]).is_empty());
        assert!(candidates(&[3, 4], &[3, 4]).is_empty());
    }

    #[test]
    fn gathering_a_range_matches_element_by_element() {
        let c = candidates(&[2, 3, 4], &[4, 3, 2]);
        let b = t(&[4, 3, 2]);
        for l in &c {
            let all = read(l, &b);
            let part = l.gather(&b, 5, 13).to_f64();
            assert_eq!(part, all[5..18].to_vec(), "{}", l.text);
            for (i, v) in all.iter().enumerate() {
                assert_eq!(b.f64_at(l.offset(i)), *v);
            }
        }
    }

    #[test]
    fn shards_concatenate_along_their_axis() {
        let (x, y) = (t(&[2, 2]), t(&[2, 1]));
        assert_eq!(concat_axes(&[vec![2, 2], vec![2, 1]]), [1]);
        assert_eq!(concat_axes(&[vec![2, 2], vec![2, 2]]), [0, 1]);
        assert_eq!(concat(&[x, y], 1).to_f64(), [0.0, 1.0, 0.0, 2.0, 3.0, 1.0]);
    }
}
