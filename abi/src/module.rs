//! The root module every plugin library exports, and the macro that exports it.
//!
//! # Evolution rules
//! The root module [`PluginModule`] and the [`Transport`](crate::Transport)
//! vtable are abi_stable *prefix types*:
//! - Fields and methods are only ever **appended**, after the field marked
//!   `#[sabi(last_prefix_field)]`; a `Transport` method appended later has a
//!   default body.
//! - What appending buys is one direction only: a **host built against an
//!   older interface loads a newer plugin** (the extra fields are ignored).
//!   A host never loads a plugin built before an append: abi_stable's layout
//!   check refuses an implementation with fewer prefix fields than the
//!   host's interface ("too many fields"; seen when `can_import_from` was
//!   appended, tested in `tests/e2e/loader.rs`). So every append is a
//!   **minor** bump (0.1 -> 0.2 while this crate is 0.x), which abi_stable
//!   refuses across with a plain version message, and plugins are rebuilt.
//! - Never reorder, remove or retype a field or method, change a type carried
//!   across the boundary, or add a variant-bearing enum: that breaks layout and
//!   the loader refuses the plugin (`AbiInstability`).
//! - Enumerations are integer codes ([`DType`](crate::DType),
//!   [`ErrorKind`](crate::ErrorKind), ...) so new codes never break layout.
//! - A **patch** bump changes no layout at all.
//! - History: 0.2.0 appended `Transport::can_import_from` (owner binding);
//!   0.3.0 appended `Transport::import_view_private` (copy-on-write views a
//!   consumer may write).
//! - [`ABI_VERSION`] travels as data in the root module so hosts can report
//!   which interface a plugin was built against.
//! - **What bumps what**: this crate holds only what crosses the boundary,
//!   so its version moves only with the boundary (the rules above). The
//!   plugin kit (`shardport-kit`: helpers, test support, the conformance
//!   suite) is a crate of its own with its own semver; any change there,
//!   breaking ones included, bumps only the kit and never refuses a plugin.
//!   A change to the host library bumps neither.

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{RResult, RStr},
    StableAbi,
};

use crate::{error::AbiError, host::HostContext, transport::TransportBox};

/// The interface version of this crate, carried as data in every plugin.
pub const ABI_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Constructor of a transport instance.
pub type NewTransportFn = extern "C" fn(ctx: HostContext) -> RResult<TransportBox, AbiError>;

/// The root module of a shardport plugin library.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModuleRef)))]
#[sabi(missing_field(option))]
pub struct PluginModule {
    /// [`ABI_VERSION`] of the `shardport-abi` the plugin was built against.
    pub abi_version: RStr<'static>,
    /// Transport name the plugin implements (`posix-shm`).
    pub transport_name: RStr<'static>,
    /// The plugin crate's own version.
    pub plugin_version: RStr<'static>,
    /// Builds one transport instance from the host context.
    #[sabi(last_prefix_field)]
    pub new_transport: extern "C" fn(ctx: HostContext) -> RResult<TransportBox, AbiError>,
}

impl RootModule for PluginModuleRef {
    declare_root_module_statics! {PluginModuleRef}
    const BASE_NAME: &'static str = "shardport_plugin";
    const NAME: &'static str = "shardport_plugin";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// Symbol under which abi_stable 0.11 looks up a library's header. Emitted by
/// [`export_plugin!`](crate::export_plugin) so plugin crates need no direct
/// `abi_stable` dependency; a unit test checks it against abi_stable's value.
#[doc(hidden)]
pub const ROOT_MODULE_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

/// Builds the root module value (used by [`export_plugin!`](crate::export_plugin)).
#[doc(hidden)]
pub fn __build_module(
    transport_name: &'static str,
    plugin_version: &'static str,
    new_transport: NewTransportFn,
) -> PluginModuleRef {
    use abi_stable::prefix_type::PrefixTypeTrait;
    PluginModule {
        abi_version: RStr::from_str(ABI_VERSION),
        transport_name: RStr::from_str(transport_name),
        plugin_version: RStr::from_str(plugin_version),
        new_transport,
    }
    .leak_into_prefix()
}

/// Exports a plugin's root module.
///
/// `new` is a `fn(PluginContext) -> PluginResult<TransportBox>`; it runs
/// panic-safely (a panic becomes an error the host reports).
///
/// ```ignore
/// shardport_abi::export_plugin! {
///     name: "my-transport",
///     version: env!("CARGO_PKG_VERSION"),
///     new: MyTransport::create,
/// }
/// ```
#[macro_export]
macro_rules! export_plugin {
    (name: $name:expr, version: $version:expr, new: $new:path $(,)?) => {
        const _: () = {
            extern "C" fn __shardport_new_transport(
                ctx: $crate::HostContext,
            ) -> $crate::__private::RResult<$crate::TransportBox, $crate::AbiError> {
                $crate::plugin::guard_constructor(ctx, $new)
            }

            fn __shardport_root_module() -> $crate::PluginModuleRef {
                $crate::module::__build_module($name, $version, __shardport_new_transport)
            }

            extern "C" fn __shardport_loader() -> $crate::__private::RootModuleResult {
                $crate::__private::call_root_module_loader(__shardport_root_module)
            }

            #[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
            #[used]
            pub static __SHARDPORT_LIB_HEADER: $crate::__private::LibHeader =
                // SAFETY: the loader returns the root module of type
                // `PluginModuleRef`, the type named here.
                unsafe {
                    $crate::__private::LibHeader::from_constructor::<$crate::PluginModuleRef>(
                        __shardport_loader,
                        $crate::__private::CheckTypeLayout::Yes,
                    )
                };
        };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn root_module_symbol_matches_abi_stable() {
        assert_eq!(
            super::ROOT_MODULE_SYMBOL,
            abi_stable::library::ROOT_MODULE_LOADER_NAME
        );
    }
}
