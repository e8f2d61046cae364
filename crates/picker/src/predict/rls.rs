//! Least squares with a forgetting factor, updated one observation at a
//! time: every observation weighs `λ` times less with each later one, so
//! a replica that changes is learned again, plus a small ridge penalty
//! that is never forgotten.
//!
//! Kept in information form (the weighted sums `Σ λ^age x xᵀ` and
//! `Σ λ^age x y`) and solved exactly after each update by a Cholesky
//! factorisation: K = 7 makes that about 150 multiplications. The usual
//! covariance-form recursion forgets its prior too, so a direction the
//! regressors never move along (no queue at low load, a replica that
//! reports no KV use, prompts never cached) has its variance grow as
//! `λ^-n` until one stray observation throws that coefficient far off;
//! bounding the covariance against that ("anti-windup") also slowed
//! learning in every other direction: with the interaction term left
//! out, a replica that became twice as slow was never learned again
//! within 1,000 requests. Here such a direction simply keeps its
//! coefficient near 0, and nothing else is touched.
//!
//! Written here rather than taken from a crate: a few dozen lines of the
//! picker's core on fixed-size arrays, run under a lock on every finished
//! request, where a matrix library would allocate.

/// The ridge penalty on the regressors' scale (of order 1): the fit
/// starts at 0 and a single observation outweighs it, yet the system is
/// always solvable.
const RIDGE: f64 = 1e-3;

/// A least-squares fit of `y ≈ θ·x` over `K` regressors.
#[derive(Debug, Clone)]
pub(crate) struct Rls<const K: usize> {
    /// `Σ λ^age x xᵀ` (upper triangle used).
    information: [[f64; K]; K],
    /// `Σ λ^age x y`.
    moments: [f64; K],
    theta: [f64; K],
}

impl<const K: usize> Default for Rls<K> {
    fn default() -> Self {
        Rls {
            information: [[0.0; K]; K],
            moments: [0.0; K],
            theta: [0.0; K],
        }
    }
}

impl<const K: usize> Rls<K> {
    pub(crate) fn coefficients(&self) -> &[f64; K] {
        &self.theta
    }

    pub(crate) fn predict(&self, x: &[f64; K]) -> f64 {
        dot(&self.theta, x)
    }

    /// Fold in one observation `y` at regressors `x`, after discounting
    /// everything before it by `forgetting` (λ in (0, 1]). Non-finite
    /// input is ignored.
    pub(crate) fn update(&mut self, x: &[f64; K], y: f64, forgetting: f64) {
        if !(y.is_finite() && x.iter().all(|v| v.is_finite())) {
            return;
        }
        for i in 0..K {
            for j in i..K {
                self.information[i][j] = forgetting * self.information[i][j] + x[i] * x[j];
            }
            self.moments[i] = forgetting * self.moments[i] + x[i] * y;
        }
        if let Some(theta) = self.solve() {
            self.theta = theta;
        }
    }

    /// `θ = (information + RIDGE·I)⁻¹ moments`, by Cholesky; `None` if
    /// rounding made the matrix lose definiteness (then the last
    /// coefficients stay).
    fn solve(&self) -> Option<[f64; K]> {
        // Lower-triangular L with L Lᵀ = information + RIDGE·I.
        let mut l = [[0.0; K]; K];
        for i in 0..K {
            for j in 0..=i {
                let a = self.information[j][i] + if i == j { RIDGE } else { 0.0 };
                let sum = a - dot_prefix(&l[i], &l[j], j);
                if i == j {
                    if sum.is_nan() || sum <= 0.0 {
                        return None;
                    }
                    l[i][i] = sum.sqrt();
                } else {
                    l[i][j] = sum / l[j][j];
                }
            }
        }
        // L z = moments, then Lᵀ θ = z.
        let mut z = [0.0; K];
        for i in 0..K {
            z[i] = (self.moments[i] - dot_prefix(&l[i], &z, i)) / l[i][i];
        }
        let mut theta = [0.0; K];
        for i in (0..K).rev() {
            let sum: f64 = (i + 1..K).map(|k| l[k][i] * theta[k]).sum();
            theta[i] = (z[i] - sum) / l[i][i];
        }
        theta.iter().all(|t| t.is_finite()).then_some(theta)
    }
}

fn dot<const K: usize>(a: &[f64; K], b: &[f64; K]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `Σ a[k]·b[k]` over `k < n`.
fn dot_prefix<const K: usize>(a: &[f64; K], b: &[f64; K], n: usize) -> f64 {
    a[..n].iter().zip(&b[..n]).map(|(a, b)| a * b).sum()
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn noiseless_data_gives_back_the_coefficients() {
        let truth = [0.5, -2.0, 3.0];
        let mut fit = Rls::<3>::default();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let x = [1.0, rng.r#gen::<f64>(), rng.r#gen::<f64>() * 2.0];
            fit.update(&x, dot(&truth, &x), 0.98);
        }
        for (fitted, truth) in fit.coefficients().iter().zip(truth) {
            assert!((fitted - truth).abs() < 1e-3, "{fitted} vs {truth}");
        }
    }

    #[test]
    fn a_direction_never_excited_stays_quiet_and_the_others_keep_learning() {
        // The third regressor is always 0 for a long time: its
        // coefficient stays 0, and a change in the others is learned at
        // the usual pace.
        let mut fit = Rls::<3>::default();
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..5_000 {
            let x = [1.0, rng.r#gen::<f64>(), 0.0];
            fit.update(&x, 1.0 + x[1], 0.9);
        }
        assert_eq!(fit.coefficients()[2], 0.0);
        for _ in 0..60 {
            let x = [1.0, rng.r#gen::<f64>(), 0.0];
            fit.update(&x, 2.0 * (1.0 + x[1]), 0.9);
        }
        let theta = fit.coefficients();
        assert!(
            (theta[0] - 2.0).abs() < 0.05 && (theta[1] - 2.0).abs() < 0.05,
            "{theta:?}"
        );
        // One stray observation along it moves it only as far as that
        // observation says.
        fit.update(&[1.0, 0.5, 1.0], 3.0 + 0.1, 0.9);
        assert!(
            fit.coefficients()[2].abs() < 0.2,
            "{:?}",
            fit.coefficients()
        );
    }

    #[test]
    fn non_finite_input_is_ignored() {
        let mut fit = Rls::<2>::default();
        fit.update(&[1.0, 1.0], 2.0, 1.0);
        let before = *fit.coefficients();
        fit.update(&[1.0, f64::NAN], 2.0, 1.0);
        fit.update(&[1.0, 1.0], f64::INFINITY, 1.0);
        assert_eq!(*fit.coefficients(), before);
    }
}
