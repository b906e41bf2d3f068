//! The rules engine: from metric values to the profile that should be active.
//!
//! A rule names a metric, a condition (`above` or `below` a threshold), how long the condition
//! must hold without a break (`for_s`, the dwell before switching), and the profile it activates.
//! Hysteresis comes from two rules on one metric with different thresholds (above 5 % → `lossy`,
//! below 1 % for 10 s → `clean`): between the thresholds neither fires and the active profile
//! stays. `min_dwell` bounds how often profiles change at all: no rule fires until the active
//! profile has been active that long. The first rule (in configuration order) that is ready and
//! names a profile other than the active one wins.
//!
//! The engine is pure: it is fed `(now, values)` and says what to switch to; the daemon does the
//! switching and tells the engine's caller when a profile changed. Time is a [`Duration`] since
//! any fixed origin, so tests drive it with synthetic sequences.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

/// A rule as written in the configuration (`[[rule]]`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Name of a `[[metric]]`.
    pub metric: String,
    /// The condition holds while the value is strictly above this.
    #[serde(default)]
    pub above: Option<f64>,
    /// The condition holds while the value is strictly below this.
    #[serde(default)]
    pub below: Option<f64>,
    /// Seconds the condition must hold without a break before the rule fires (default 0).
    #[serde(default)]
    pub for_s: f64,
    /// The profile the rule activates.
    pub activate: String,
}

/// Why a rule is not usable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RuleError {
    #[error("rule {index} (metric `{metric}`): give exactly one of `above` and `below`")]
    Condition { index: usize, metric: String },
    #[error("rule {index} (metric `{metric}`): `for_s` must be a finite number of seconds >= 0, not {for_s}")]
    Dwell {
        index: usize,
        metric: String,
        for_s: f64,
    },
    #[error("rule {index}: no metric named `{metric}`")]
    UnknownMetric { index: usize, metric: String },
    #[error("rule {index} (metric `{metric}`): no profile named `{profile}`")]
    UnknownProfile {
        index: usize,
        metric: String,
        profile: String,
    },
}

impl Rule {
    /// Whether `value` meets the rule's condition.
    pub fn holds(&self, value: f64) -> bool {
        match (self.above, self.below) {
            (Some(t), _) => value > t,
            (None, Some(t)) => value < t,
            (None, None) => false,
        }
    }

    /// The condition as text (`> 5`, `< 1`), for logs.
    pub fn condition(&self) -> String {
        match (self.above, self.below) {
            (Some(t), _) => format!("> {t}"),
            (None, Some(t)) => format!("< {t}"),
            (None, None) => "never".to_string(),
        }
    }

    fn validate(&self, index: usize) -> Result<(), RuleError> {
        if self.above.is_some() == self.below.is_some() {
            return Err(RuleError::Condition {
                index,
                metric: self.metric.clone(),
            });
        }
        if !self.for_s.is_finite() || self.for_s < 0.0 {
            return Err(RuleError::Dwell {
                index,
                metric: self.metric.clone(),
                for_s: self.for_s,
            });
        }
        Ok(())
    }
}

/// A decision of the engine: switch to `profile` because `rule`'s metric had `value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub profile: String,
    /// Index of the rule in the configuration.
    pub rule: usize,
    pub metric: String,
    pub value: f64,
    /// How long the condition had held.
    pub held: Duration,
}

/// The rules and, per rule, since when its condition has held without a break.
#[derive(Debug)]
pub struct Engine {
    rules: Vec<Rule>,
    min_dwell: Duration,
    held_since: Vec<Option<Duration>>,
}

impl Engine {
    /// An engine over `rules`; each must name one of `metrics` and `profiles`.
    pub fn new(
        rules: Vec<Rule>,
        min_dwell: Duration,
        metrics: &[&str],
        profiles: &[&str],
    ) -> Result<Self, RuleError> {
        for (index, r) in rules.iter().enumerate() {
            r.validate(index)?;
            if !metrics.contains(&r.metric.as_str()) {
                return Err(RuleError::UnknownMetric {
                    index,
                    metric: r.metric.clone(),
                });
            }
            if !profiles.contains(&r.activate.as_str()) {
                return Err(RuleError::UnknownProfile {
                    index,
                    metric: r.metric.clone(),
                    profile: r.activate.clone(),
                });
            }
        }
        let held_since = vec![None; rules.len()];
        Ok(Engine {
            rules,
            min_dwell,
            held_since,
        })
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Feed one observation at `now`. `values` has the metrics that could be sampled this time
    /// (a metric missing from it breaks the conditions of its rules: nothing is known to hold).
    /// `active` is the profile active now and `switched_at` when it became active. Returns the
    /// profile to switch to, if a rule is ready.
    pub fn observe(
        &mut self,
        now: Duration,
        values: &HashMap<String, f64>,
        active: Option<&str>,
        switched_at: Option<Duration>,
    ) -> Option<Decision> {
        for (i, r) in self.rules.iter().enumerate() {
            let holds = values.get(&r.metric).is_some_and(|&v| r.holds(v));
            self.held_since[i] = match (holds, self.held_since[i]) {
                (false, _) => None,
                (true, Some(since)) => Some(since),
                (true, None) => Some(now),
            };
        }
        if let Some(at) = switched_at {
            if now.saturating_sub(at) < self.min_dwell {
                log::trace!(
                    "rules: within the minimum dwell of {:?} since the last switch",
                    self.min_dwell
                );
                return None;
            }
        }
        for (i, r) in self.rules.iter().enumerate() {
            let Some(since) = self.held_since[i] else {
                continue;
            };
            if active == Some(r.activate.as_str()) {
                continue;
            }
            let held = now.saturating_sub(since);
            if held.as_secs_f64() + 1e-9 < r.for_s {
                log::debug!(
                    "rule {i}: {} {} for {:?} of {} s",
                    r.metric,
                    r.condition(),
                    held,
                    r.for_s
                );
                continue;
            }
            let value = values[&r.metric];
            log::debug!(
                "rule {i} fires: {} = {value} {} for {:?} -> {}",
                r.metric,
                r.condition(),
                held,
                r.activate
            );
            return Some(Decision {
                profile: r.activate.clone(),
                rule: i,
                metric: r.metric.clone(),
                value,
                held,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(
        metric: &str,
        above: Option<f64>,
        below: Option<f64>,
        for_s: f64,
        activate: &str,
    ) -> Rule {
        Rule {
            metric: metric.into(),
            above,
            below,
            for_s,
            activate: activate.into(),
        }
    }

    /// above 5 → lossy at once; below 1 for 3 s → clean; no minimum dwell unless given.
    fn lossy_clean(min_dwell: u64) -> Engine {
        Engine::new(
            vec![
                rule("retrans", Some(5.0), None, 0.0, "lossy"),
                rule("retrans", None, Some(1.0), 3.0, "clean"),
            ],
            Duration::from_secs(min_dwell),
            &["retrans"],
            &["lossy", "clean"],
        )
        .unwrap()
    }

    /// Runs a sequence of one-second samples through the engine, switching whenever it says so;
    /// returns `(second, profile)` for every switch.
    fn run(engine: &mut Engine, start: &str, samples: &[f64]) -> Vec<(u64, String)> {
        let mut active = start.to_string();
        let mut switched_at = None;
        let mut out = Vec::new();
        for (t, &v) in (0u64..).zip(samples) {
            let now = Duration::from_secs(t);
            let values = HashMap::from([("retrans".to_string(), v)]);
            if let Some(d) = engine.observe(now, &values, Some(&active), switched_at) {
                assert_eq!(d.value, v, "the decision carries the value that caused it");
                active = d.profile.clone();
                switched_at = Some(now);
                out.push((t, d.profile));
            }
        }
        out
    }

    #[test]
    fn crossing_the_high_threshold_switches_at_once() {
        let mut e = lossy_clean(0);
        assert_eq!(
            run(&mut e, "clean", &[0.0, 2.0, 7.5, 9.0]),
            vec![(2, "lossy".to_string())]
        );
    }

    #[test]
    fn values_between_the_thresholds_keep_the_active_profile_either_way() {
        let mut e = lossy_clean(0);
        // Up into lossy, then hovering at 3 % (between 1 and 5) for a long time: no switch back.
        assert_eq!(
            run(
                &mut e,
                "clean",
                &[6.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 4.9, 1.0]
            ),
            vec![(0, "lossy".to_string())]
        );
        // From clean, 3 % never leaves clean.
        let mut e = lossy_clean(0);
        assert!(run(&mut e, "clean", &[3.0; 10]).is_empty());
    }

    #[test]
    fn low_rule_waits_for_its_dwell_and_a_break_restarts_the_wait() {
        let mut e = lossy_clean(0);
        // lossy at 0; below 1 from t=1; broken at t=3 (value 2); below again from t=4, so the
        // 3 s are complete at t=7.
        let got = run(
            &mut e,
            "clean",
            &[8.0, 0.5, 0.5, 2.0, 0.5, 0.5, 0.5, 0.5, 0.5],
        );
        assert_eq!(
            got,
            vec![(0, "lossy".to_string()), (7, "clean".to_string())]
        );
    }

    #[test]
    fn minimum_dwell_delays_a_switch_back_even_when_the_rule_is_ready() {
        let mut e = Engine::new(
            vec![
                rule("retrans", Some(5.0), None, 0.0, "lossy"),
                rule("retrans", None, Some(1.0), 0.0, "clean"),
            ],
            Duration::from_secs(5),
            &["retrans"],
            &["lossy", "clean"],
        )
        .unwrap();
        let got = run(
            &mut e,
            "clean",
            &[9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0, 9.0],
        );
        // lossy at 0; clean would be ready at 1 but waits for t=5; back to lossy needs t>=10.
        assert_eq!(
            got,
            vec![(0, "lossy".to_string()), (5, "clean".to_string())]
        );
    }

    #[test]
    fn a_missing_sample_breaks_the_condition() {
        let mut e = lossy_clean(0);
        let mut active = "lossy".to_string();
        let below = HashMap::from([("retrans".to_string(), 0.0)]);
        let none = HashMap::new();
        for (t, values) in [
            (0, &below),
            (1, &below),
            (2, &none),
            (3, &below),
            (4, &below),
            (5, &below),
        ] {
            assert!(
                e.observe(Duration::from_secs(t), values, Some(&active), None)
                    .is_none(),
                "t={t}"
            );
        }
        let d = e
            .observe(Duration::from_secs(6), &below, Some(&active), None)
            .unwrap();
        assert_eq!(
            (d.profile.as_str(), d.held),
            ("clean", Duration::from_secs(3))
        );
        active = d.profile;
        assert_eq!(active, "clean");
    }

    #[test]
    fn first_ready_rule_in_order_wins() {
        let mut e = Engine::new(
            vec![
                rule("a", Some(1.0), None, 0.0, "p"),
                rule("b", Some(1.0), None, 0.0, "q"),
            ],
            Duration::ZERO,
            &["a", "b"],
            &["p", "q"],
        )
        .unwrap();
        let values = HashMap::from([("a".to_string(), 2.0), ("b".to_string(), 2.0)]);
        assert_eq!(
            e.observe(Duration::ZERO, &values, None, None)
                .unwrap()
                .profile,
            "p"
        );
        // With p active, the next ready rule is q's.
        assert_eq!(
            e.observe(Duration::from_secs(1), &values, Some("p"), None)
                .unwrap()
                .rule,
            1
        );
    }

    #[test]
    fn rules_naming_unknown_metrics_or_profiles_or_two_conditions_are_refused() {
        let bad = |r: Rule| Engine::new(vec![r], Duration::ZERO, &["m"], &["p"]).unwrap_err();
        assert_eq!(
            bad(rule("x", Some(1.0), None, 0.0, "p")),
            RuleError::UnknownMetric {
                index: 0,
                metric: "x".into()
            }
        );
        assert!(matches!(
            bad(rule("m", Some(1.0), None, 0.0, "zz")),
            RuleError::UnknownProfile { .. }
        ));
        assert!(matches!(
            bad(rule("m", Some(1.0), Some(0.0), 0.0, "p")),
            RuleError::Condition { .. }
        ));
        assert!(matches!(
            bad(rule("m", None, None, 0.0, "p")),
            RuleError::Condition { .. }
        ));
        assert!(matches!(
            bad(rule("m", None, Some(1.0), -1.0, "p")),
            RuleError::Dwell { .. }
        ));
    }
}
