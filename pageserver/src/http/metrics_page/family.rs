//! [`Family`]: one metric family a collector fills afresh at every scrape.
//!
//! Its [`Desc`] is made once, when the collector is, so a bad name, label name or empty help
//! fails at startup (and in every test that builds the page), not at a scrape; a registry
//! refuses a collector whose families clash with those it holds. At a scrape, [`Family::fill`]
//! builds a new [`MetricFamily`] and nothing of it outlives the scrape: no series is kept
//! between scrapes, so none is left behind when what it describes goes.

use std::collections::HashMap;

use prometheus::core::Desc;
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// A family's description and type; see the module documentation.
pub struct Family {
    desc: Desc,
    kind: MetricType,
}

impl Family {
    pub fn gauge(name: &str, help: &str, labels: &[&str]) -> Family {
        Family::new(name, help, labels, MetricType::GAUGE)
    }

    pub fn counter(name: &str, help: &str, labels: &[&str]) -> Family {
        Family::new(name, help, labels, MetricType::COUNTER)
    }

    fn new(name: &str, help: &str, labels: &[&str], kind: MetricType) -> Family {
        let desc = Desc::new(
            name.to_owned(),
            help.to_owned(),
            labels.iter().map(|l| (*l).to_owned()).collect(),
            HashMap::new(),
        )
        .unwrap_or_else(|e| panic!("metric family {name}: {e}"));
        Family { desc, kind }
    }

    pub fn desc(&self) -> &Desc {
        &self.desc
    }

    /// An empty family with room for `series` samples, to fill with [`Samples::add`].
    pub fn fill(&self, series: usize) -> Samples<'_> {
        let mut proto = MetricFamily::default();
        proto.set_name(self.desc.fq_name.clone());
        proto.set_help(self.desc.help.clone());
        proto.set_field_type(self.kind);
        proto.set_metric(Vec::with_capacity(series));
        Samples {
            family: self,
            proto,
        }
    }

    /// The family of one unlabelled sample.
    pub fn single(&self, value: f64) -> MetricFamily {
        let mut samples = self.fill(1);
        samples.add(&[], value);
        samples.done()
    }
}

/// A family being filled.
pub struct Samples<'a> {
    family: &'a Family,
    proto: MetricFamily,
}

impl Samples<'_> {
    /// One series: `label_values` in the order of the family's label names.
    pub fn add(&mut self, label_values: &[&str], value: f64) {
        let names = &self.family.desc.variable_labels;
        assert_eq!(
            label_values.len(),
            names.len(),
            "{}: label values {label_values:?} for labels {names:?}",
            self.family.desc.fq_name
        );
        let labels = names
            .iter()
            .zip(label_values)
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name(name.clone());
                pair.set_value((*value).to_owned());
                pair
            })
            .collect();
        let mut metric = Metric::from_label(labels);
        match self.family.kind {
            MetricType::COUNTER => {
                let mut counter = Counter::default();
                counter.set_value(value);
                metric.set_counter(counter);
            }
            MetricType::GAUGE => {
                let mut gauge = Gauge::default();
                gauge.set_value(value);
                metric.set_gauge(gauge);
            }
            other => unreachable!("Family makes gauges and counters only, not {other:?}"),
        }
        self.proto.mut_metric().push(metric);
    }

    pub fn done(self) -> MetricFamily {
        self.proto
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_carry_the_family_s_labels_type_and_values() {
        let family = Family::counter("x_total", "Xs", &["kind", "reason"]);
        let mut samples = family.fill(2);
        samples.add(&["a", "b"], 3.0);
        samples.add(&["c", "d\"e"], 4.5);
        let proto = samples.done();
        assert_eq!(proto.name(), "x_total");
        assert_eq!(proto.help(), "Xs");
        assert_eq!(proto.get_field_type(), MetricType::COUNTER);
        let metrics = proto.get_metric();
        assert_eq!(metrics.len(), 2);
        let labels: Vec<_> = metrics[1]
            .get_label()
            .iter()
            .map(|l| (l.name(), l.value()))
            .collect();
        assert_eq!(labels, [("kind", "c"), ("reason", "d\"e")]);
        assert_eq!(metrics[1].get_counter().get_value(), 4.5);

        let gauge = Family::gauge("y", "Ys", &[]).single(7.0);
        assert_eq!(gauge.get_field_type(), MetricType::GAUGE);
        assert_eq!(gauge.get_metric()[0].get_gauge().get_value(), 7.0);
        assert!(gauge.get_metric()[0].get_label().is_empty());
    }

    #[test]
    #[should_panic(expected = "label values")]
    fn a_sample_without_every_label_is_refused() {
        Family::gauge("y", "Ys", &["kind"]).fill(1).add(&[], 1.0);
    }

    #[test]
    #[should_panic(expected = "not a valid metric name")]
    fn a_bad_name_fails_when_the_family_is_made() {
        Family::gauge("pageserver-bad", "Bad", &[]);
    }
}
