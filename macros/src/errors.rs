//! The mistakes found in one attribute, kept in the order they were found, so that the user sees
//! every one of them at once, each at its own span.

use proc_macro2::Span;
use syn::Error;

/// Errors collected by the parser and the rules.
#[derive(Default)]
pub struct Errors(Vec<Error>);

impl Errors {
    /// A mistake at `span`.
    pub fn push(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.0.push(Error::new(span, msg));
    }

    /// A parse error (which may itself hold several).
    pub fn push_error(&mut self, e: Error) {
        self.0.push(e);
    }

    /// Another collection's errors, after these.
    pub fn append(&mut self, other: Errors) {
        self.0.extend(other.0);
    }

    /// All of them as one `syn::Error` (`Error::combine`), or `Ok` when there are none.
    pub fn finish(self) -> syn::Result<()> {
        let mut all = self.0.into_iter();
        let Some(mut first) = all.next() else {
            return Ok(());
        };
        for e in all {
            first.combine(e);
        }
        Err(first)
    }

    /// Every message, in order (for tests).
    #[cfg(test)]
    pub fn messages(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|e| e.clone().into_iter().map(|e| e.to_string()))
            .collect()
    }
}

impl From<Error> for Errors {
    fn from(e: Error) -> Self {
        Errors(vec![e])
    }
}
