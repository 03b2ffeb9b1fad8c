//! The fault kit (`idem::fault_kit`) run over tools whose ledgers the tests read: a correct
//! keyed tool passes every fault with exactly one charge in each bank; tools that charge
//! twice, that claim a key contract their bank does not keep, or whose bank has none, are
//! caught or reported for what they are.

mod bank;
mod broken;
mod correct;
mod read_back;
mod unkeyed;
