//! The priority structures the policies build on, each with its own unit tests.

mod groups;
mod list;
mod selector;
mod value_counts;

pub(crate) use groups::{Groups, NIL};
pub(crate) use list::List;
pub(crate) use selector::Selector;
pub(crate) use value_counts::{ValueCounts, pick_counted};
