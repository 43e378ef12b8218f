//! Decode settings: the knobs a user turns, validated once so the engine can trust them.

use serde::{Deserialize, Serialize};

/// Which masked positions a denoising step commits. docs/decoding.md defines each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
/// Each also answers to its hyphenated spelling and a short name (`--strategy` ignores case).
pub enum Strategy {
    Sequential,
    #[value(alias = "low-confidence-static", alias = "static")]
    LowConfidenceStatic,
    #[value(alias = "low-confidence-dynamic", alias = "dynamic")]
    LowConfidenceDynamic,
    #[value(alias = "entropy-bounded", alias = "entropy")]
    EntropyBounded,
    /// LLaDA2.1's token editing: commits masks and replaces decoded tokens (SGLang's name).
    #[value(alias = "joint-threshold", alias = "joint", alias = "edit")]
    JointThreshold,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::Sequential,
        Strategy::LowConfidenceStatic,
        Strategy::LowConfidenceDynamic,
        Strategy::EntropyBounded,
        Strategy::JointThreshold,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Sequential => "sequential",
            Strategy::LowConfidenceStatic => "low_confidence_static",
            Strategy::LowConfidenceDynamic => "low_confidence_dynamic",
            Strategy::EntropyBounded => "entropy_bounded",
            Strategy::JointThreshold => "joint_threshold",
        }
    }

    /// The next strategy in `ALL`, wrapping; the TUI's `m` key.
    pub fn next(self) -> Strategy {
        let i = Strategy::ALL.iter().position(|&s| s == self).unwrap_or(0);
        Strategy::ALL[(i + 1) % Strategy::ALL.len()]
    }
}

/// How many positions a fixed-schedule step commits, and whether dynamic honours the schedule.
/// SDAR's generate.py and lmdeploy differ here; both are offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Schedule {
    /// `block_length / steps` per step, the first `block_length % steps` steps one more
    /// (capped at the masks left); confidence from the distribution a token is drawn from.
    Sdar,
    /// `max(1, block_length / steps)` per step; dynamic ignores steps; confidence from the
    /// temperature-scaled softmax before top-k and top-p.
    Lmdeploy,
}

impl Schedule {
    /// Where the reference this schedule follows reads a sample's confidence.
    pub fn confidence(self) -> Confidence {
        match self {
            Schedule::Sdar => Confidence::Drawn,
            Schedule::Lmdeploy => Confidence::Scaled,
        }
    }

    /// How the reference this schedule follows cuts top-k.
    pub fn top_k(self) -> TopK {
        match self {
            Schedule::Sdar => TopK::TiesKept,
            Schedule::Lmdeploy => TopK::Exact,
        }
    }
}

/// What top-k keeps where logits tie at the k-th (docs/decoding.md, "Sampler").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TopK {
    /// Exactly `k` tokens, equal logits by id: lmdeploy (its sorted top-k).
    #[default]
    Exact,
    /// Every token whose logit equals the k-th as well, so possibly more than `k`: SDAR's
    /// generate.py (`top_k_logits` drops only logits below the k-th).
    TiesKept,
}

/// Which distribution a sample's confidence and entropy are read from (docs/decoding.md,
/// "Sampler"). Greedy decoding has one distribution, so both give the same numbers there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Confidence {
    /// The one the token is drawn from, after top-k and top-p: SDAR's generate.py.
    #[default]
    Drawn,
    /// The temperature-scaled softmax over the whole vocabulary, before top-k and top-p:
    /// lmdeploy (its unmasking reads `softmax` of the logits its sampler got, which have the
    /// temperature applied and are filtered only on the sampler's sorted copies) and JetEngine.
    Scaled,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeSettings {
    pub strategy: Strategy,
    pub schedule: Schedule,
    pub threshold: f32,
    pub eb_threshold: f32,
    pub block_length: usize,
    pub steps: usize,
    pub sampling: Sampling,
    pub max_new_tokens: usize,
    /// joint_threshold: a decoded token is replaced by the pass's when they differ and the
    /// pass's probability is over this. Traces written before editing existed have none.
    #[serde(default = "default_edit_threshold")]
    pub edit_threshold: f32,
    /// joint_threshold: passes a block may take once no mask is left.
    #[serde(default = "default_max_post_steps")]
    pub max_post_steps: usize,
    /// Whether the decode ends after the block that holds the first EOS (SDAR, LLaDA2.0); when
    /// off, every block to `max_new_tokens` is decoded and the output still ends at the first
    /// EOS, as LLaDA2.1's `generate()` does by default.
    #[serde(default = "yes")]
    pub eos_early_stop: bool,
    /// Texts that end the output (`--stop`): the decode ends after the block in which the
    /// output's text first contains one, the output at the token that completes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

/// LLaDA2.1's `generate()` defaults.
pub const EDIT_THRESHOLD: f32 = 0.9;
pub const MAX_POST_STEPS: usize = 16;

fn default_edit_threshold() -> f32 {
    EDIT_THRESHOLD
}

fn default_max_post_steps() -> usize {
    MAX_POST_STEPS
}

fn yes() -> bool {
    true
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// 0 is greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1 disables top-p.
    pub top_p: f32,
    pub seed: u64,
}

impl Sampling {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

/// What the sampler is handed: the decode's sampling and the two rules of the reference whose
/// sampler it reproduces. Never recorded: a trace records the schedule they follow from
/// ([`DecodeSettings::sampler`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerSpec {
    pub sampling: Sampling,
    pub confidence: Confidence,
    pub top_k_rule: TopK,
}

impl SamplerSpec {
    pub fn is_greedy(&self) -> bool {
        self.sampling.is_greedy()
    }
}

/// Greedy, under the plainest rules.
impl Default for SamplerSpec {
    fn default() -> Self {
        Sampling::default().into()
    }
}

/// `sampling` under the plainest rules: confidence read from the distribution drawn from,
/// top-k keeping exactly k (what the sampler's own tests state their cases in).
impl From<Sampling> for SamplerSpec {
    fn from(sampling: Sampling) -> Self {
        SamplerSpec { sampling, confidence: Confidence::Drawn, top_k_rule: TopK::Exact }
    }
}

impl Default for DecodeSettings {
    fn default() -> Self {
        DecodeSettings {
            strategy: Strategy::LowConfidenceDynamic,
            schedule: Schedule::Sdar,
            threshold: 0.85,
            eb_threshold: 0.35,
            block_length: 4,
            steps: 4,
            sampling: Sampling::default(),
            max_new_tokens: 256,
            edit_threshold: EDIT_THRESHOLD,
            max_post_steps: MAX_POST_STEPS,
            eos_early_stop: true,
            stop: Vec::new(),
        }
    }
}

/// A setting out of its range. Shown as the flag's error (`--top-p must be within (0, 1] (got
/// 5)`); [`Self::requirement`] and [`Self::value`] let a file's value be named as the file's.
#[derive(Debug, PartialEq)]
pub enum SettingsError {
    BlockLength(usize),
    Steps(usize),
    Threshold(f32),
    EbThreshold(f32),
    Temperature(f32),
    TopP(f32),
    MaxNewTokens(usize),
    EditThreshold(f32),
    MaxPostSteps(usize),
}

impl SettingsError {
    /// The flag that sets the value.
    pub fn flag(&self) -> &'static str {
        match self {
            SettingsError::BlockLength(_) => "--block-length",
            SettingsError::Steps(_) => "--steps",
            SettingsError::Threshold(_) => "--threshold",
            SettingsError::EbThreshold(_) => "--eb-threshold",
            SettingsError::Temperature(_) => "--temperature",
            SettingsError::TopP(_) => "--top-p",
            SettingsError::MaxNewTokens(_) => "--max-new-tokens",
            SettingsError::EditThreshold(_) => "--edit-threshold",
            SettingsError::MaxPostSteps(_) => "--max-post-steps",
        }
    }

    /// What the value must be: `must be within [0, 1]`.
    pub fn requirement(&self) -> String {
        use crate::limits::{MAX_BLOCK_LENGTH, MAX_NEW_TOKENS, MAX_STEPS};
        match self {
            SettingsError::BlockLength(_) => format!("must be within 1 to {MAX_BLOCK_LENGTH}"),
            SettingsError::Steps(_) => format!("must be within 1 to {MAX_STEPS}"),
            SettingsError::Threshold(_) | SettingsError::EditThreshold(_) => {
                "must be within [0, 1]".into()
            }
            SettingsError::MaxPostSteps(_) => format!("must be within 0 to {MAX_STEPS}"),
            SettingsError::EbThreshold(_) | SettingsError::Temperature(_) => {
                "must be a finite number >= 0".into()
            }
            SettingsError::TopP(_) => "must be within (0, 1]".into(),
            SettingsError::MaxNewTokens(_) => format!("must be within 1 to {MAX_NEW_TOKENS}"),
        }
    }

    /// The value refused, as given.
    pub fn value(&self) -> String {
        match self {
            SettingsError::BlockLength(v)
            | SettingsError::Steps(v)
            | SettingsError::MaxNewTokens(v)
            | SettingsError::MaxPostSteps(v) => v.to_string(),
            SettingsError::Threshold(v)
            | SettingsError::EditThreshold(v)
            | SettingsError::EbThreshold(v)
            | SettingsError::Temperature(v)
            | SettingsError::TopP(v) => v.to_string(),
        }
    }
}

impl std::fmt::Display for SettingsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} (got {})", self.flag(), self.requirement(), self.value())
    }
}

impl std::error::Error for SettingsError {}

/// A block length any decode may take (`validate` checks the settings' own; a block size read
/// from elsewhere is checked here before it becomes one).
pub fn check_block_length(b: usize) -> Result<(), SettingsError> {
    if !(1..=crate::limits::MAX_BLOCK_LENGTH).contains(&b) {
        return Err(SettingsError::BlockLength(b));
    }
    Ok(())
}

impl DecodeSettings {
    /// What the sampler is handed: `sampling`, with the confidence and top-k rule of the
    /// schedule's reference.
    pub fn sampler(&self) -> SamplerSpec {
        SamplerSpec {
            sampling: self.sampling,
            confidence: self.schedule.confidence(),
            top_k_rule: self.schedule.top_k(),
        }
    }

    /// The threshold the strategy reads, named as the flags name it: `threshold` for
    /// low_confidence_dynamic and joint_threshold (whose edit threshold is the summary's),
    /// `eb` for entropy_bounded, none for the others.
    pub fn threshold_knob(&self) -> Option<(&'static str, f32)> {
        match self.strategy {
            Strategy::LowConfidenceDynamic | Strategy::JointThreshold => {
                Some(("threshold", self.threshold))
            }
            Strategy::EntropyBounded => Some(("eb", self.eb_threshold)),
            Strategy::Sequential | Strategy::LowConfidenceStatic => None,
        }
    }

    /// The most denoising steps a block may take: where the strategy follows the schedule's
    /// per-step counts, `steps` under sdar's (at most one a position), and under lmdeploy's
    /// as many steps of `max(1, B / S)` as a block's `B` positions take (B8 S3 commits 2 a
    /// step: 4 steps, not 3); else one a position (entropy_bounded, and low_confidence_dynamic
    /// under lmdeploy's rule, loop until no mask is left); joint_threshold adds its passes
    /// after the last mask.
    pub fn step_budget(&self) -> usize {
        let per_position = self.block_length.max(1);
        let rule = crate::sampler::strategy::StepRule::from_settings(self);
        if rule.edits() {
            return per_position + self.max_post_steps;
        }
        if !rule.follows_schedule() {
            return per_position;
        }
        match self.schedule {
            Schedule::Sdar => self.steps.min(per_position),
            // every step commits the same count (the rule's), until the positions run out
            Schedule::Lmdeploy => per_position.div_ceil(rule.scheduled(0)),
        }
    }

    /// The steps a block takes at most when `steps` asks for more than its positions (each
    /// step commits at least one): `Some(block_length)` then, for the rules that read `steps`.
    pub fn capped_steps(&self) -> Option<usize> {
        let rule = crate::sampler::strategy::StepRule::from_settings(self);
        (rule.follows_schedule() && self.steps > self.block_length).then_some(self.block_length)
    }

    pub fn validate(&self) -> Result<(), SettingsError> {
        let s = &self.sampling;
        use crate::limits::{MAX_NEW_TOKENS, MAX_STEPS};
        check_block_length(self.block_length)?;
        if !(1..=MAX_STEPS).contains(&self.steps) {
            return Err(SettingsError::Steps(self.steps));
        }
        if !(0.0..=1.0).contains(&self.threshold) {
            return Err(SettingsError::Threshold(self.threshold));
        }
        if !self.eb_threshold.is_finite() || self.eb_threshold < 0.0 {
            return Err(SettingsError::EbThreshold(self.eb_threshold));
        }
        if !s.temperature.is_finite() || s.temperature < 0.0 {
            return Err(SettingsError::Temperature(s.temperature));
        }
        if !(s.top_p > 0.0 && s.top_p <= 1.0) {
            return Err(SettingsError::TopP(s.top_p));
        }
        if !(1..=MAX_NEW_TOKENS).contains(&self.max_new_tokens) {
            return Err(SettingsError::MaxNewTokens(self.max_new_tokens));
        }
        if !(0.0..=1.0).contains(&self.edit_threshold) {
            return Err(SettingsError::EditThreshold(self.edit_threshold));
        }
        if self.max_post_steps > MAX_STEPS {
            return Err(SettingsError::MaxPostSteps(self.max_post_steps));
        }
        Ok(())
    }

    /// These settings with the block length and generation length of `base`: the two that
    /// shape a decode's layout, so neither a mid-decode change nor a restart alters them.
    pub fn keeping_layout_of(mut self, base: &DecodeSettings) -> DecodeSettings {
        self.block_length = base.block_length;
        self.max_new_tokens = base.max_new_tokens;
        self
    }

    /// A one-line summary for status bars and table headers.
    pub fn summary(&self) -> String {
        let mut s =
            format!("{} block {} steps {}", self.strategy.name(), self.block_length, self.steps);
        match self.strategy {
            Strategy::LowConfidenceDynamic => {
                s += &format!(" thr={}", crate::format::fixed(self.threshold.into(), 2))
            }
            Strategy::EntropyBounded => {
                s += &format!(" eb={}", crate::format::fixed(self.eb_threshold.into(), 2))
            }
            Strategy::JointThreshold => {
                let f = |v: f32| crate::format::fixed(v.into(), 2);
                s += &format!(
                    " thr={} edit={} post={}",
                    f(self.threshold),
                    f(self.edit_threshold),
                    self.max_post_steps
                )
            }
            _ => {}
        }
        if !self.eos_early_stop {
            s += " past-eos";
        }
        if self.schedule == Schedule::Lmdeploy {
            s += " lmdeploy";
        }
        if self.sampling.is_greedy() {
            s += " greedy";
        } else {
            // what makes two sampled decodes differ: the filters and the seed
            let p = &self.sampling;
            s += &format!(" T={}", p.temperature);
            if p.top_k > 0 {
                s += &format!(" k={}", p.top_k);
            }
            if p.top_p < 1.0 {
                s += &format!(" p={}", p.top_p);
            }
            s += &format!(" seed={}", p.seed);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sampled decode's summary names what makes two of them differ (compare showed two
    /// sides of different seeds as the same settings).
    /// `B=4` read as compare's side B: the block length and steps are spelled out.
    #[test]
    fn the_summary_spells_out_block_and_steps() {
        let s =
            DecodeSettings { strategy: Strategy::LowConfidenceStatic, ..DecodeSettings::default() }
                .summary();
        assert_eq!(s, "low_confidence_static block 4 steps 4 greedy");
    }

    #[test]
    fn a_sampled_summary_names_its_filters_and_seed() {
        let with = |sampling| DecodeSettings { sampling, ..DecodeSettings::default() }.summary();
        let s = with(Sampling { temperature: 0.7, top_k: 40, top_p: 0.95, seed: 2 });
        assert!(s.ends_with(" T=0.7 k=40 p=0.95 seed=2"), "{s}");
        let s = with(Sampling { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0 });
        assert!(s.ends_with(" T=1 seed=0"), "{s}");
        assert!(DecodeSettings::default().summary().ends_with(" greedy"));
    }

    /// The sampler reads confidence where the schedule's reference does, whatever the settings
    /// were loaded from (a trace does not record it: the schedule says it).
    #[test]
    fn the_sampler_takes_its_confidence_from_the_schedule() {
        let with = |schedule| DecodeSettings { schedule, ..DecodeSettings::default() };
        assert_eq!(with(Schedule::Sdar).sampler().confidence, Confidence::Drawn);
        assert_eq!(with(Schedule::Lmdeploy).sampler().confidence, Confidence::Scaled);
        assert_eq!(with(Schedule::Sdar).sampler().top_k_rule, TopK::TiesKept);
        assert_eq!(with(Schedule::Lmdeploy).sampler().top_k_rule, TopK::Exact);
    }

    /// The step budget is the steps a block may take: under lmdeploy's counts a block of 8 in
    /// 3 steps takes 4 (2 a step); sdar's counts never exceed `steps`.
    #[test]
    fn the_step_budget_counts_the_steps_a_block_can_take() {
        let with = |schedule, strategy, b, s| {
            DecodeSettings {
                schedule,
                strategy,
                block_length: b,
                steps: s,
                ..DecodeSettings::default()
            }
            .step_budget()
        };
        assert_eq!(with(Schedule::Lmdeploy, Strategy::LowConfidenceStatic, 8, 3), 4);
        assert_eq!(with(Schedule::Lmdeploy, Strategy::Sequential, 8, 8), 8);
        assert_eq!(with(Schedule::Lmdeploy, Strategy::Sequential, 4, 16), 4);
        assert_eq!(with(Schedule::Lmdeploy, Strategy::LowConfidenceStatic, 7, 2), 3);
        assert_eq!(with(Schedule::Sdar, Strategy::LowConfidenceStatic, 8, 3), 3);
        assert_eq!(with(Schedule::Sdar, Strategy::LowConfidenceStatic, 4, 16), 4);
        assert_eq!(with(Schedule::Sdar, Strategy::EntropyBounded, 4, 2), 4);
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(DecodeSettings::default().validate(), Ok(()));
    }

    #[test]
    fn rejects_each_bad_field() {
        let base = DecodeSettings::default();
        let cases: Vec<(DecodeSettings, SettingsError)> = vec![
            (DecodeSettings { block_length: 0, ..base.clone() }, SettingsError::BlockLength(0)),
            (DecodeSettings { steps: 0, ..base.clone() }, SettingsError::Steps(0)),
            (DecodeSettings { threshold: 1.5, ..base.clone() }, SettingsError::Threshold(1.5)),
            (DecodeSettings { max_new_tokens: 0, ..base.clone() }, SettingsError::MaxNewTokens(0)),
            (
                DecodeSettings { max_new_tokens: usize::MAX, ..base.clone() },
                SettingsError::MaxNewTokens(usize::MAX),
            ),
            (
                DecodeSettings { block_length: 1 << 40, ..base.clone() },
                SettingsError::BlockLength(1 << 40),
            ),
            (DecodeSettings { steps: 5000, ..base.clone() }, SettingsError::Steps(5000)),
            (
                DecodeSettings {
                    sampling: Sampling { top_p: 0.0, ..base.sampling },
                    ..base.clone()
                },
                SettingsError::TopP(0.0),
            ),
            (
                DecodeSettings {
                    sampling: Sampling { temperature: -1.0, ..base.sampling },
                    ..base.clone()
                },
                SettingsError::Temperature(-1.0),
            ),
        ];
        for (s, want) in cases {
            assert_eq!(s.validate(), Err(want));
        }
    }

    #[test]
    fn strategy_cycle_visits_all() {
        let mut s = Strategy::Sequential;
        let mut seen = vec![];
        for _ in 0..Strategy::ALL.len() {
            seen.push(s);
            s = s.next();
        }
        assert_eq!(seen, Strategy::ALL.to_vec());
        assert_eq!(s, Strategy::Sequential);
    }
}
