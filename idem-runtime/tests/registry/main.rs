//! What a registry checks before anything runs: tool definitions, its clock against its
//! store's, required tenants, call limits, value arguments, and the notices a refused
//! repeat with changed parameters raises.

mod call_limits;
mod changed_params_notices;
mod clock;
mod definitions;
mod require_tenant;
mod value_args;
