//! Conversion and Service warnings: logged once per object and change,
//! counted by reason, news for the runtime.

use super::*;

impl Index {
    /// Records the current warnings of `object`; they are logged and counted
    /// only when they differ from the ones recorded before. `true` when they
    /// were logged.
    pub(super) fn set_warnings(
        &mut self,
        object: String,
        warnings: Vec<String>,
        skipped: &BTreeMap<SkipReason, u64>,
    ) -> bool {
        if warnings.is_empty() {
            self.warnings.remove(&object);
            return false;
        }
        if self.warnings.get(&object) == Some(&warnings) {
            return false;
        }
        for w in &warnings {
            tracing::warn!(cluster = %self.cluster, "{w}");
        }
        self.count_skipped(skipped);
        self.warnings.insert(object, warnings);
        true
    }

    pub(super) fn count_skipped(&mut self, skipped: &BTreeMap<SkipReason, u64>) {
        for (reason, n) in skipped {
            let c = self.skipped.entry(*reason).or_insert(0);
            *c = c.saturating_add(*n);
        }
    }

    pub(super) fn skipped_nameless(&mut self, kind: &str, ns: &str) {
        tracing::warn!(cluster = %self.cluster, namespace = ns, "{kind} without metadata.name; skipped");
        self.count_skipped(&BTreeMap::from([(SkipReason::MissingName, 1)]));
    }

    /// Records the annotation and ExternalName warnings of a Service (see
    /// `set_warnings`); when they are news, also for
    /// [`Index::take_service_news`].
    pub(super) fn service_warnings(
        &mut self,
        namespace: &str,
        name: &str,
        object: String,
        info: &ServiceInfo,
    ) {
        let news = self.service_news_of(namespace, name, object, info);
        self.service_news.extend(news);
    }

    /// [`Index::service_warnings`] without recording the news: returns it.
    pub(super) fn service_news_of(
        &mut self,
        namespace: &str,
        name: &str,
        object: String,
        info: &ServiceInfo,
    ) -> Option<ServiceNews> {
        let mut warnings: Vec<(SkipReason, String)> = info
            .invalid
            .iter()
            .map(|w| (SkipReason::InvalidAnnotation, w.clone()))
            .collect();
        let mut skipped = BTreeMap::new();
        if !warnings.is_empty() {
            let n = u64::try_from(warnings.len()).unwrap_or(u64::MAX);
            skipped.insert(SkipReason::InvalidAnnotation, n);
        }
        if let Some((reason, message)) = self.external_refusal(&object, info) {
            warnings.push((reason, message));
            skipped.insert(reason, 1);
        }
        let texts = warnings.iter().map(|(_, w)| w.clone()).collect();
        self.set_warnings(object, texts, &skipped)
            .then(|| ServiceNews {
                namespace: namespace.to_string(),
                name: name.to_string(),
                warnings,
            })
    }

    /// The Services whose skipped annotations or refused ExternalName were
    /// logged since the last call: new or changed, never again for the same
    /// bad Service on a relist (the runtime turns them into Events).
    pub fn take_service_news(&mut self) -> Vec<ServiceNews> {
        std::mem::take(&mut self.service_news)
    }

    /// Current conversion warnings, per object.
    pub fn warnings(&self) -> impl Iterator<Item = (&String, &Vec<String>)> {
        self.warnings.iter()
    }

    /// The warnings logged since the last call, counted per reason (each
    /// logged warning line counts once; an unchanged bad object seen again,
    /// e.g. on a relist, is not counted again).
    pub fn take_skipped(&mut self) -> BTreeMap<SkipReason, u64> {
        std::mem::take(&mut self.skipped)
    }
}

/// The [`Index::warnings`] entry of what the merge of `key`'s EndpointSlices
/// skipped (one per service, not per slice: the merge decides).
pub(super) fn merge_warnings_key(key: &ServiceKey) -> String {
    format!("EndpointSlices of {}/{}", key.namespace, key.name)
}
