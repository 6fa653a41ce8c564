//! A local emulator of the IBM Cloud endpoints provider-service's `ibmcloud` and
//! `ibmcloud-powervs` backends call, for tests: [`VpcEmulator`] (IAM, VPC API, Global Tagging)
//! and [`PowerVsEmulator`] (IAM, Power Cloud API, Global Tagging). Each is an axum server on
//! 127.0.0.1, on its own thread, stopped when dropped; answers are built from the fixtures in
//! `fixtures/` (see the README for their sources).

mod common;
mod powervs;
mod vpc;

pub use common::{ACCOUNT_ID, API_KEY, IbmEmulator, Knobs};
pub use powervs::{PowerVsEmulator, WORKSPACE_ID, ZONE as POWERVS_ZONE};
pub use vpc::{VpcEmulator, ZONE as VPC_ZONE};
