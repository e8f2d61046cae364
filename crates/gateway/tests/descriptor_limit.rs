//! `infergate serve` raises its soft limit on open file descriptors to the
//! hard one. A test binary of its own: it changes the process's limit.

mod support;

use support::descriptors::{DescriptorLimit, open_descriptors};

#[test]
fn the_soft_limit_is_raised_to_the_hard_one() {
    let hard = DescriptorLimit::hard();
    let _restore = DescriptorLimit::lower_to(hard.min(open_descriptors() + 4096) - 1);
    assert!(DescriptorLimit::soft() < hard);
    assert_eq!(gateway::raise_descriptor_limit().unwrap(), hard);
    assert_eq!(DescriptorLimit::soft(), hard);
}
