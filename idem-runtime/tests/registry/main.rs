//! What a registry checks before anything runs: tool definitions, key options, its clock against its
//! store's, required tenants, call limits, value arguments, and the notices a refused
//! repeat with changed parameters raises.

mod call_limits;
mod changed_params_notices;
mod clock;
mod definitions;
mod key_options;
mod require_tenant;
mod value_args;
