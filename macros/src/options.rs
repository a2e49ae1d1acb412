//! The options of `#[golden_layer(...)]`, in one table: the parser dispatches on it, the
//! unknown-option error lists it, the module-form rule reads it, and the attribute's manual
//! (`macros/golden_layer.md`, the macro's rustdoc) shows it, checked by a test to be this
//! table — so that the four cannot drift apart.
//!
//! The top-level parse is here too: every option of an attribute is read, a mistake in one does
//! not stop the others from being read (and reported).

use crate::decl::{Attr, DecodeDecl, GradDecl, OverfitDecl};
use crate::errors::Errors;
use crate::parse;
use proc_macro2::TokenStream;
use syn::parse::{ParseStream, Parser};
use syn::{Ident, Result, Token};

/// One option of the attribute.
pub struct Opt {
    /// Its keyword.
    pub name: &'static str,
    /// How it is written (its grammar, in the manual's notation).
    #[cfg_attr(not(test), allow(dead_code))]
    // read by the test that keeps the manual's table this one
    pub form: &'static str,
    /// What it does, in a line (markdown).
    #[cfg_attr(not(test), allow(dead_code))]
    // read by the test that keeps the manual's table this one
    pub doc: &'static str,
    /// `Some(error)` when it exists in the module form only: the error in the function form.
    pub module_only: Option<&'static str>,
    /// Reads the rest of the option after its keyword (`= ...`, `(...)` or nothing) into the
    /// description.
    pub parse: fn(&Ident, ParseStream, &mut Attr) -> Result<()>,
}

/// Every option, in the order the manual lists them.
pub const OPTIONS: &[Opt] = &[
    Opt {
        name: "reference",
        form: r#"reference = "pkg.mod.callable""#,
        doc: "required. The Python original: a function (function form) or an `nn.Module` class \
              (module form), importable from the reference folder",
        module_only: None,
        parse: |_, input, attr| {
            attr.reference = Some(parse::equals(input)?);
            Ok(())
        },
    },
    Opt {
        name: "backend",
        form: r#"backend = "torch" | "numpy""#,
        doc: "how tensors reach the reference: torch tensors (the default) or NumPy arrays",
        module_only: None,
        parse: |_, input, attr| {
            attr.backend = Some(parse::equals(input)?);
            Ok(())
        },
    },
    Opt {
        name: "dims",
        form: "dims(name = lo..=hi, name = lo..hi, name = n, ...)",
        doc: "symbolic dimensions, each drawn per case from its range",
        module_only: None,
        parse: |_, input, attr| {
            attr.dims = parse::parenthesized_list(input, parse::dim)?;
            Ok(())
        },
    },
    Opt {
        name: "args",
        form: "args(name = [axis, ...] ~ DIST, ...)",
        doc: "a shape (and optionally a distribution) for every tensor parameter, by name",
        module_only: None,
        parse: |_, input, attr| {
            attr.args = parse::parenthesized_list(input, parse::arg)?;
            Ok(())
        },
    },
    Opt {
        name: "consts",
        form: "consts(name = value, ...)",
        doc: "non-tensor values: to the Rust parameter of that name and as keywords to the \
              reference",
        module_only: None,
        parse: |_, input, attr| {
            attr.consts = parse::parenthesized_list(input, parse::key_value)?;
            Ok(())
        },
    },
    Opt {
        name: "init",
        form: "init(name = value, ...)",
        doc: "keywords of the reference module's constructor, also given to same-named Rust \
              parameters",
        module_only: Some(
            "`init(...)` configures the reference nn.Module; it needs the module form, whose \
             first parameter is a `VarBuilder`",
        ),
        parse: |_, input, attr| {
            attr.init = parse::parenthesized_list(input, parse::key_value)?;
            Ok(())
        },
    },
    Opt {
        name: "config",
        form: r#"config = "pkg.ConfigClass"(name = value, ...)"#,
        doc: "build the reference module from a configuration object (`ConfigClass(**values)`); \
              its values also reach same-named Rust parameters",
        module_only: Some(
            "`config` builds the reference nn.Module from a configuration class; it needs the \
             module form, whose first parameter is a `VarBuilder`",
        ),
        parse: |_, input, attr| {
            attr.config = Some(parse::config(input)?);
            Ok(())
        },
    },
    Opt {
        name: "dtype",
        form: "dtype = f32",
        doc: "the float dtype of the inputs: `f32` (the default), `f64`, `f16` or `bf16`",
        module_only: None,
        parse: |key, input, attr| {
            attr.dtype = Some((key.clone(), parse::equals(input)?));
            Ok(())
        },
    },
    Opt {
        name: "dtypes",
        form: "dtypes = [f32, bf16, ...]",
        doc: "several float dtypes, each checked on the same cases",
        module_only: None,
        parse: |key, input, attr| {
            attr.dtypes = Some((key.clone(), parse::dtypes(key, input)?));
            Ok(())
        },
    },
    Opt {
        name: "tol",
        form: "tol(atol = x, rtol = y)",
        doc: "replace the default tolerance by `|port − ref| ≤ atol + rtol·|ref|`",
        module_only: None,
        parse: |_, input, attr| {
            attr.tol = Some(parse::tol(input)?);
            Ok(())
        },
    },
    Opt {
        name: "cases",
        form: "cases = N",
        doc: "generated cases per dtype; default 32 (`GOLDEN_CASES` overrides)",
        module_only: None,
        parse: |key, input, attr| {
            attr.cases = Some(parse::count(key, input)?);
            Ok(())
        },
    },
    Opt {
        name: "budget",
        form: r#"budget = "60s""#,
        doc:
            "choose how many of the `cases` run from a time budget for the whole check (`\"90s\"`, \
              `\"2m\"`; `GOLDEN_BUDGET` overrides): as many as fit, at least one; the golden store \
              keeps the count",
        module_only: None,
        parse: |key, input, attr| {
            attr.budget = Some(parse::budget(key, input)?);
            Ok(())
        },
    },
    Opt {
        name: "grad",
        form: "grad / grad(wrt = [x, \"fc1.weight\"], eps = x, atol = x, rtol = x, mode = fast | \
               full, cases = N)",
        doc: "also check the port's gradients against finite differences (test `gradients`)",
        module_only: None,
        parse: |_, input, attr| {
            attr.grad = Some(if parse::has_parens(input) {
                parse::grad(input)?
            } else {
                GradDecl::default()
            });
            Ok(())
        },
    },
    Opt {
        name: "overfit",
        form: "overfit / overfit(steps = N, loss = mse | cross_entropy, optimizer = sgd | adamw, \
               lr = x, ratio = x, threshold = x)",
        doc: "also train the port on one batch beside PyTorch (test `overfits_single_batch`)",
        module_only: Some(
            "`overfit` trains a module: it needs the module form, whose first parameter is a \
             `VarBuilder`",
        ),
        parse: |_, input, attr| {
            attr.overfit = Some(if parse::has_parens(input) {
                parse::overfit(input)?
            } else {
                OverfitDecl::default()
            });
            Ok(())
        },
    },
    Opt {
        name: "timeout",
        form: "timeout = seconds",
        doc: "how long the reference may take on one request, and the port on one call",
        module_only: None,
        parse: |key, input, attr| {
            attr.timeout = Some(parse::timeout(key, input)?);
            Ok(())
        },
    },
    Opt {
        name: "speed",
        form: "speed(max = x)",
        doc: "fail the forward check when the port takes more than `x` times the reference's \
              time, its timed runs agreeing (a speed failure, apart from the numbers)",
        module_only: None,
        parse: |key, input, attr| {
            attr.speed = Some(parse::speed(key, input)?);
            Ok(())
        },
    },
    Opt {
        name: "trace",
        form: "trace",
        doc: "compare the port's `golden::tap` points with the reference's submodules, in \
              execution order",
        module_only: Some(
            "`trace` compares the port's taps with the reference module's submodules: it needs \
             the module form, whose first parameter is a `VarBuilder`",
        ),
        parse: |key, _, attr| {
            attr.trace = Some(key.clone());
            Ok(())
        },
    },
    Opt {
        name: "params",
        form: "params = drawn | init | drawn_all | init_scale",
        doc: "where the module's parameters come from: drawn per case at unit gain (the default), \
              its own init, drawn including frozen ones and buffers computed at init, or drawn at \
              each entry's own initial scale",
        module_only: Some(
            "`params` is about the reference module's parameters: it needs the module form, whose \
             first parameter is a `VarBuilder`",
        ),
        parse: |key, input, attr| {
            attr.params = Some((key.clone(), parse::params(input)?));
            Ok(())
        },
    },
    Opt {
        name: "weights",
        form: r#"weights = "path.safetensors""#,
        doc: "serve a checkpoint's tensors to both sides (path relative to the crate)",
        module_only: Some(
            "`weights` is about the reference module's parameters: it needs the module form, \
             whose first parameter is a `VarBuilder`",
        ),
        parse: |key, input, attr| {
            attr.weights = Some((key.clone(), parse::equals(input)?));
            Ok(())
        },
    },
    Opt {
        name: "rename",
        form: r#"rename("ref prefix" = "port prefix", ...)"#,
        doc: "serve the reference's parameter names starting with a prefix to the port under \
              another",
        module_only: Some(
            "`rename` is about the reference module's parameters: it needs the module form, whose \
             first parameter is a `VarBuilder`",
        ),
        parse: |key, input, attr| {
            attr.rename = Some((
                key.clone(),
                parse::parenthesized_list(input, parse::rename_pair)?,
            ));
            Ok(())
        },
    },
    Opt {
        name: "decode",
        form: "decode / decode(over = x, axis = N, padding, generate = N, window = N, sample(temperature = T, top_k = K, top_p = P, min_p = M, repetition_penalty = R), beams = K, length_penalty = L, early_stopping)",
        doc: "drive a port that keeps state (a KV cache) through generated schedules of calls",
        module_only: Some(
            "`decode` drives a module through time: it needs the module form, whose first \
             parameter is a `VarBuilder` (the function builds the model and returns a stepper)",
        ),
        parse: |key, input, attr| {
            attr.decode = Some(if parse::has_parens(input) {
                parse::decode(key, input)?
            } else {
                DecodeDecl::bare(key.clone())
            });
            Ok(())
        },
    },
    Opt {
        name: "steps",
        form: r#"steps(over = dim, carry(arg = out, arg = "out.1", ...))"#,
        doc: "drive a step function through a loop of `dim` steps, feeding outputs back as \
              arguments",
        module_only: None,
        parse: |key, input, attr| {
            attr.steps = Some(parse::steps(key, input)?);
            Ok(())
        },
    },
    Opt {
        name: "invariants",
        form: r#"invariants(out = [finite, ...], "out.key" = [...])"#,
        doc: "properties of the port's outputs checked on every case: `finite`, `non_negative`, \
              `sums_to_one(dim = d)`, `range(lo, hi)`",
        module_only: None,
        parse: |key, input, attr| {
            attr.invariants = Some(parse::invariants(key, input)?);
            Ok(())
        },
    },
];

/// The option called `name`.
pub fn find(name: &str) -> Option<&'static Opt> {
    OPTIONS.iter().find(|o| o.name == name)
}

/// The options' table as the manual shows it (markdown).
#[cfg(test)]
pub fn markdown_table() -> String {
    let mut out = String::from("| option | module form only | what it does |\n|---|---|---|\n");
    for o in OPTIONS {
        let form = o.form.replace('|', "\\|");
        let doc = o.doc.replace('|', "\\|");
        let module = if o.module_only.is_some() { "yes" } else { "" };
        out.push_str(&format!("| `{form}` | {module} | {doc} |\n"));
    }
    out
}

/// Reads the whole attribute: the description, with what parsed, and every mistake of its
/// grammar. After a mistake in an option's value, reading goes on at the next option (its
/// top-level comma); that option is then marked broken.
pub fn parse(tokens: TokenStream) -> (Attr, Errors) {
    let mut attr = Attr::default();
    let result = (|input: ParseStream| read_options(input, &mut attr).finish()).parse2(tokens);
    let errors = match result {
        Ok(()) => Errors::default(),
        Err(e) => Errors::from(e),
    };
    (attr, errors)
}

fn read_options(input: ParseStream, attr: &mut Attr) -> Errors {
    let mut errors = Errors::default();
    while !input.is_empty() {
        match read_option(input, attr) {
            Ok(()) => {}
            Err(e) => {
                errors.push_error(e);
                parse::skip_to_comma(input);
            }
        }
        if input.is_empty() {
            break;
        }
        if let Err(e) = input.parse::<Token![,]>() {
            errors.push_error(e);
            parse::skip_to_comma(input);
            let _ = input.parse::<Option<Token![,]>>();
        }
    }
    errors
}

/// One option: its keyword, then its value by the table.
fn read_option(input: ParseStream, attr: &mut Attr) -> Result<()> {
    let key: Ident = input
        .parse()
        .map_err(|e| syn::Error::new(e.span(), format!("expected an option: {}", names())))?;
    let name = key.to_string();
    if attr.key(&name).is_some() {
        return Err(syn::Error::new(
            key.span(),
            format!("`{name}` is given twice"),
        ));
    }
    let Some(opt) = find(&name) else {
        return Err(syn::Error::new(
            key.span(),
            format!("unknown option `{name}`; expected one of: {}", names()),
        ));
    };
    attr.given.push(key.clone());
    (opt.parse)(&key, input, attr).inspect_err(|_| attr.broken.push(name))
}

/// `reference, backend, ...`.
fn names() -> String {
    OPTIONS
        .iter()
        .map(|o| o.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn names_of(attr: &Attr) -> Vec<String> {
        attr.given.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_option_of_the_table_parses_into_the_description() {
        let (attr, errors) = parse(quote!(
            reference = "pkg.mod.Block",
            backend = "torch",
            dims(b = 1..=4, t = 2..9, d = 8),
            args(x = [b, t, d] ~ normal(0.0, 2.0), ids = [b, t] ~ int(0..d)),
            consts(eps = 1e-5),
            init(hidden = d, heads = one_of(1, 2)),
            config = "transformers.LlamaConfig"(vocab_size = 32),
            dtype = f32,
            dtypes = [f32, bf16],
            tol(atol = 1e-4),
            cases = 8,
            budget = "1.5m",
            grad(wrt = [x, "fc.weight"], mode = full),
            overfit(steps = 20, loss = mse),
            timeout = 2.5,
            speed(max = 3),
            trace,
            params = init,
            weights = "w.safetensors",
            rename("a." = "b."),
            decode(over = ids, padding),
            steps(over = t, carry(x = out)),
            invariants(out = [finite, sums_to_one(dim = -1)]),
        ));
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        let table: Vec<&str> = OPTIONS.iter().map(|o| o.name).collect();
        assert_eq!(
            names_of(&attr),
            table,
            "the test gives every option, in the table's order"
        );
        assert!(attr.broken.is_empty());
        assert_eq!(attr.reference.unwrap().value(), "pkg.mod.Block");
        let dims: Vec<(String, usize, usize)> = attr
            .dims
            .iter()
            .map(|d| (d.name.to_string(), d.lo, d.hi))
            .collect();
        assert_eq!(
            dims,
            [("b".into(), 1, 4), ("t".into(), 2, 8), ("d".into(), 8, 8)],
            "`lo..hi` is exclusive, a single size is both ends"
        );
        assert_eq!(attr.args.len(), 2);
        assert!(matches!(attr.args[1].dist, Some(DistDecl::Int(..))));
        assert!(matches!(attr.init[1].value, ValueDecl::OneOf(_, ref v) if v.len() == 2));
        assert_eq!(
            attr.config.unwrap().class.value(),
            "transformers.LlamaConfig"
        );
        assert_eq!(attr.dtypes.unwrap().1.len(), 2);
        assert_eq!(attr.tol, Some((1e-4, 0.0)), "the tolerance not given is 0");
        assert_eq!(attr.cases, Some(8));
        assert_eq!(attr.budget, Some(90.0));
        assert_eq!(attr.grad.unwrap().full, Some(true));
        assert_eq!(attr.overfit.unwrap().steps, Some(20));
        assert_eq!(attr.timeout, Some(2.5));
        assert_eq!(attr.speed, Some(3.0));
        assert!(attr.decode.unwrap().padding);
        assert_eq!(attr.steps.unwrap().carry[0].1, "out");
        assert_eq!(attr.invariants.unwrap().leaves[0].2.len(), 2);
    }

    #[test]
    fn bare_forms_take_the_defaults() {
        let (attr, errors) = parse(quote!(reference = "m.f", grad, overfit, decode));
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        let grad = attr.grad.unwrap();
        assert!(grad.wrt.is_none() && grad.full.is_none());
        assert!(attr.overfit.unwrap().steps.is_none());
        assert!(attr.decode.unwrap().over.is_none());
    }

    #[test]
    fn decode_takes_the_sampling_parameters() {
        let (attr, errors) = parse(quote!(
            reference = "m.M",
            decode(
                generate = 3,
                sample(
                    temperature = 0.7,
                    top_k = 8,
                    top_p = 0.9,
                    min_p = 0.05,
                    repetition_penalty = 1
                )
            ),
        ));
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        let decode = attr.decode.unwrap();
        assert_eq!(decode.generate, Some(3));
        let sample = decode.sample.unwrap();
        assert_eq!(
            (
                sample.temperature,
                sample.top_k,
                sample.top_p,
                sample.min_p,
                sample.repetition_penalty
            ),
            (Some(0.7), Some(8), Some(0.9), Some(0.05), Some(1.0))
        );
        let (attr, errors) = parse(quote!(reference = "m.M", decode(generate = 2, sample)));
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        assert!(attr.decode.unwrap().sample.unwrap().temperature.is_none());
        let (_, errors) = parse(quote!(reference = "m.M", decode(sample(top_q = 0.5))));
        assert!(
            errors.messages()[0].contains("expected `temperature = <float>`"),
            "{:?}",
            errors.messages()
        );
    }

    #[test]
    fn decode_takes_the_beam_search_parameters() {
        let (attr, errors) = parse(quote!(
            reference = "m.M",
            decode(
                generate = 3,
                beams = 4,
                length_penalty = -0.5,
                early_stopping
            ),
        ));
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        let decode = attr.decode.unwrap();
        assert_eq!(
            (decode.beams, decode.length_penalty, decode.early_stopping),
            (Some(4), Some(-0.5), true)
        );
        let (_, errors) = parse(quote!(reference = "m.M", decode(generate = 3, beams = 0)));
        assert!(
            errors.messages()[0].contains("`beams` must be at least 1"),
            "{:?}",
            errors.messages()
        );
    }

    #[test]
    fn speed_takes_a_positive_factor() {
        let (attr, errors) = parse(quote!(reference = "m.f", speed(max = 2.5)));
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        assert_eq!(attr.speed, Some(2.5));
        for (written, error) in [
            (
                quote!(reference = "m.f", speed),
                "expected `speed(max = x)`",
            ),
            (
                quote!(reference = "m.f", speed(min = 2)),
                "expected `speed(max = x)`",
            ),
            (
                quote!(reference = "m.f", speed(max = 0)),
                "must be a positive factor",
            ),
            (
                quote!(reference = "m.f", speed(max = 2, runs = 3)),
                "expected `speed(max = x)`",
            ),
        ] {
            let (attr, errors) = parse(written);
            assert!(
                errors.messages().len() == 1 && errors.messages()[0].contains(error),
                "{:?}",
                errors.messages()
            );
            assert!(attr.is_broken("speed"));
        }
    }

    use crate::decl::{DistDecl, ValueDecl};

    #[test]
    fn a_malformed_option_does_not_stop_the_others_from_being_read() {
        let (attr, errors) = parse(quote!(
            reference = "m.f",
            dims(n = 4..=1),
            tolerance = 1e-3,
            args(x = [n] ~ gauss(0, 1)),
            cases = 0,
            dtype = f64,
        ));
        assert_eq!(
            errors.messages(),
            [
                "`4..=1` is an empty range",
                &format!("unknown option `tolerance`; expected one of: {}", names()),
                "expected a distribution: `normal(mean, std)`, `uniform(lo, hi)`, `int(lo..hi)`, \
                 `bool` or `positions` (`positions(max)`)",
                "`cases` must be at least 1",
            ]
        );
        assert_eq!(attr.broken, ["dims", "args", "cases"]);
        assert_eq!(
            attr.dtype.map(|(_, d)| d.to_string()).as_deref(),
            Some("f64"),
            "the option after the mistakes is read"
        );
    }

    #[test]
    fn every_malformed_item_of_a_list_is_reported() {
        let (attr, errors) = parse(quote!(reference = "m.f", dims(a = x, b = 1..=2, c = "y")));
        assert_eq!(
            errors.messages(),
            [
                "expected a range of sizes, like `1..=16`",
                "expected a range of sizes, like `1..=16`",
            ]
        );
        assert!(attr.is_broken("dims"));
    }

    #[test]
    fn an_option_given_twice_is_a_mistake() {
        let (attr, errors) = parse(quote!(reference = "m.f", cases = 4, cases = 8));
        assert_eq!(errors.messages(), ["`cases` is given twice"]);
        assert_eq!(attr.cases, Some(4), "the first stands");
    }

    #[test]
    fn a_budget_is_seconds_or_minutes() {
        let (attr, errors) = parse(quote!(reference = "m.f", budget = "45s"));
        assert!(errors.messages().is_empty(), "{:?}", errors.messages());
        assert_eq!(attr.budget, Some(45.0));
        for bad in [
            quote!(budget = "soon"),
            quote!(budget = "0s"),
            quote!(budget = "60"),
        ] {
            let (attr, errors) = parse(quote!(reference = "m.f", #bad));
            assert_eq!(attr.budget, None);
            let messages = errors.messages();
            assert!(
                messages.len() == 1
                    && messages[0].contains("is not a time budget: write seconds or minutes"),
                "{messages:?}"
            );
        }
    }

    #[test]
    fn a_missing_comma_is_reported_and_reading_goes_on() {
        let (attr, errors) = parse(quote!(reference = "m.f" cases = 4, timeout = 3));
        assert_eq!(errors.messages(), ["expected `,`"]);
        assert_eq!(attr.timeout, Some(3.0));
    }

    #[test]
    fn not_an_option_names_them_all() {
        let (_, errors) = parse(quote!(reference = "m.f", 42));
        assert_eq!(
            errors.messages(),
            [format!("expected an option: {}", names())]
        );
    }

    #[test]
    fn the_table_names_each_option_once() {
        for (i, o) in OPTIONS.iter().enumerate() {
            assert!(
                OPTIONS[..i].iter().all(|p| p.name != o.name),
                "`{}` twice",
                o.name
            );
            assert!(
                o.form.starts_with(o.name),
                "`{}`'s form starts with it",
                o.name
            );
            assert!(
                !o.doc.is_empty() && !o.doc.ends_with('.'),
                "`{}`'s doc",
                o.name
            );
        }
    }
}

#[cfg(test)]
mod manual {
    /// The manual's table of options is this table: `TABLE=write cargo test -p golden-macros`
    /// writes it there.
    #[test]
    fn the_manual_shows_the_table() {
        const START: &str = "<!-- the options' table, written from macros/src/options.rs -->\n";
        const END: &str = "<!-- end of the options' table -->";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/golden_layer.md");
        let text = std::fs::read_to_string(path).unwrap();
        let (start, end) = (
            text.find(START).expect("the table's start") + START.len(),
            text.find(END).expect("the table's end"),
        );
        let table = super::markdown_table();
        if std::env::var("TABLE").as_deref() == Ok("write") {
            std::fs::write(path, format!("{}{table}{}", &text[..start], &text[end..])).unwrap();
            return;
        }
        assert_eq!(
            text[start..end],
            table,
            "the manual's table is not the options' table: TABLE=write cargo test -p golden-macros"
        );
    }

    /// The book's chapter on the attribute (`docs/src/attribute.md`) has a row for every option:
    /// one added here without a row there fails, naming it.
    #[test]
    fn the_books_chapter_has_a_row_for_every_option() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/attribute.md");
        let text = std::fs::read_to_string(path).unwrap();
        // The first cell of each table row, where the option's forms are written.
        let cells: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| l.split(" | ").next().unwrap())
            .collect();
        let written = |name: &str| {
            cells.iter().any(|cell| {
                cell.match_indices(&format!("`{name}")).any(|(at, m)| {
                    let next = cell[at + m.len()..].chars().next();
                    !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
            })
        };
        let missing: Vec<&str> = super::OPTIONS
            .iter()
            .map(|o| o.name)
            .filter(|n| !written(n))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/src/attribute.md has no row for {missing:?}"
        );
    }
}
