//! One way to write the `with_*` builder methods of an options struct.
//!
//! Every coord options struct (store options, adapter options, native lock
//! options, job options) has public fields, a `Default`, and one builder
//! method per field that takes `self` and returns it changed. This macro
//! writes those methods from one line each, so they all look and behave the
//! same (a method may still adjust the value, e.g. clamp it to at least 1).

/// Builder methods for an options struct: each line
/// `method(arg: Type) => field = expression;` becomes
/// `pub fn method(mut self, arg: Type) -> Self` that sets `self.field` to
/// the expression and returns `self`. Attributes (doc comments) written
/// above a line go on its method.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Debug, Default)]
/// pub struct PoolOptions {
///     /// Most connections.
///     pub max_connections: u32,
///     /// How long to wait for one.
///     pub connect_timeout: Option<Duration>,
/// }
///
/// coord_backend::setters! {
///     PoolOptions {
///         /// With another [`max_connections`](Self::max_connections) (at least 1).
///         with_max_connections(max: u32) => max_connections = max.max(1);
///         /// Wait at most `timeout` for a connection.
///         with_connect_timeout(timeout: Duration) => connect_timeout = Some(timeout);
///     }
/// }
///
/// let options = PoolOptions::default()
///     .with_max_connections(0)
///     .with_connect_timeout(Duration::from_secs(2));
/// assert_eq!(options.max_connections, 1);
/// assert_eq!(options.connect_timeout, Some(Duration::from_secs(2)));
/// ```
#[macro_export]
macro_rules! setters {
    ($options:ty {
        $(
            $(#[$attr:meta])*
            $method:ident($arg:ident: $value:ty) => $field:ident = $set:expr;
        )*
    }) => {
        impl $options {
            $(
                $(#[$attr])*
                pub fn $method(mut self, $arg: $value) -> Self {
                    self.$field = $set;
                    self
                }
            )*
        }
    };
}
