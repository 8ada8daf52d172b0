//! `GenericElection` records (`/api/elections`, the leaders page): each
//! election's latest term and its live leader, if any. The value a leader
//! announces belongs to the application and is not shown.

use coord_adapters::election::{ElectionError, GenericElection};
use coord_backend::Error;
use serde::Serialize;

use super::{ms, read_page, Page, Paged, Row, Stores};

/// One election of `GenericElection` (`election/<name>`). The leader's
/// announced value is the application's: not shown.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ElectionView {
    pub(crate) name: String,
    /// The latest term granted (0: never won).
    pub(crate) term: u64,
    /// The live leader's candidate id; `None` when nobody leads (resigned, expired, never).
    pub(crate) leader: Option<String>,
    pub(crate) lease_expires_ms: Option<u64>,
}

impl Row for ElectionView {
    const FIELD: &'static str = "elections";
}

/// The elections of one page.
pub(crate) type ElectionsView = Paged<ElectionView>;

/// The elections of `page` (default prefix `election/`).
pub(crate) async fn elections(stores: &Stores, page: &Page) -> Result<ElectionsView, Error> {
    let election = GenericElection::new(stores.backend.clone());
    let prefix = election.key_prefix().to_owned();
    read_page(stores, &prefix, page, |name| {
        let election = &election;
        async move {
            let status = election.status(&name).await.map_err(election_error)?;
            Ok(status.map(|status| ElectionView {
                name,
                term: status.term,
                lease_expires_ms: status.leader.as_ref().map(|l| ms(l.expires_at)),
                leader: status.leader.map(|l| l.candidate),
            }))
        }
    })
    .await
}

fn election_error(e: ElectionError) -> Error {
    match e {
        ElectionError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}
