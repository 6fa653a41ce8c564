//! The instance id rule of libvirt: a domain UUID, hyphenated.

use peerpods_provider_core::Error;

/// Whether `instance_id` is a domain UUID as libvirt prints it.
pub(crate) fn validate(instance_id: &str) -> Result<(), Error> {
    // libvirt prints UUIDs hyphenated; other spellings uuid accepts (braced, urn) would be
    // lookups of ids no caller got from libvirt.
    if instance_id.len() == 36 && uuid::Uuid::try_parse(instance_id).is_ok() {
        Ok(())
    } else {
        Err(Error::invalid(
            "instance_id",
            "not a libvirt domain UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
        ))
    }
}
