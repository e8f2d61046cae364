//! What the checks found, each at its path.

use crate::problem::Problem;

pub struct Problems(pub Vec<Problem>);

impl Problems {
    pub fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }
}
