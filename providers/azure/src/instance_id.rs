//! Syntax of cloud-api-adaptor's Azure instance id: the VM's full ARM resource id,
//! `/subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<name>`.
//! ARM compares segment names and resource names case-insensitively.

/// A parsed VM resource id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmId {
    pub subscription: String,
    pub resource_group: String,
    pub name: String,
}

impl VmId {
    /// The resource path, as ARM spells it (used for requests; the caller's casing of the
    /// names is kept).
    pub fn path(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{}",
            self.subscription, self.resource_group, self.name
        )
    }
}

/// Parses `id`, or says precisely what is wrong with it.
pub fn parse(id: &str) -> Result<VmId, String> {
    const SHAPE: &str = "expected /subscriptions/<id>/resourceGroups/<name>/providers/Microsoft.Compute/virtualMachines/<name>";
    if id.is_empty() {
        return Err(format!("empty; {SHAPE}"));
    }
    let Some(rest) = id.strip_prefix('/') else {
        return Err(format!("must start with '/'; {SHAPE}"));
    };
    let segments: Vec<&str> = rest.split('/').collect();
    if segments.len() != 8 {
        return Err(format!(
            "has {} path segments instead of 8; {SHAPE}",
            segments.len()
        ));
    }
    for (index, expected) in [
        (0, "subscriptions"),
        (2, "resourceGroups"),
        (4, "providers"),
        (5, "Microsoft.Compute"),
        (6, "virtualMachines"),
    ] {
        if !segments[index].eq_ignore_ascii_case(expected) {
            return Err(format!(
                "segment {} is {:?}, expected {expected:?}; {SHAPE}",
                index + 1,
                segments[index]
            ));
        }
    }
    let subscription = segments[1];
    if !is_guid(subscription) {
        return Err("the subscription id is not a GUID (8-4-4-4-12 hexadecimal digits)".into());
    }
    if let Some(problem) = resource_group_problem(segments[3]) {
        return Err(problem);
    }
    if let Some(problem) = vm_name_problem(segments[7]) {
        return Err(problem);
    }
    Ok(VmId {
        subscription: subscription.to_owned(),
        resource_group: segments[3].to_owned(),
        name: segments[7].to_owned(),
    })
}

/// Whether `text` is a GUID as Azure writes subscription ids (a UUID, either case).
pub use peerpods_provider_core::is_uuid as is_guid;

/// What is wrong with a resource group name (ARM: 1-90 letters, digits, `_`, `-`, `.`, `(`, `)`,
/// not ending with `.`).
pub fn resource_group_problem(name: &str) -> Option<String> {
    let length = name.chars().count();
    if !(1..=90).contains(&length) {
        return Some(format!(
            "the resource group name has {length} characters; ARM allows 1 to 90"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '(' | ')')))
    {
        return Some(format!(
            "the resource group name contains {c:?}; ARM allows letters, digits, '_', '-', '.', '(' and ')'"
        ));
    }
    if name.ends_with('.') {
        return Some("the resource group name ends with '.'".into());
    }
    None
}

/// What is wrong with a VM name (Linux VMs: 1-64 ASCII letters, digits, `-`, `_`, `.`; not
/// starting with `_`, not ending with `.` or `-`).
fn vm_name_problem(name: &str) -> Option<String> {
    if !(1..=64).contains(&name.len()) {
        return Some(format!(
            "the VM name has {} bytes; Azure allows 1 to 64 characters",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "the VM name contains {c:?}; Azure allows ASCII letters, digits, '-', '_' and '.'"
        ));
    }
    if name.starts_with('_') {
        return Some("the VM name starts with '_'".into());
    }
    if name.ends_with('.') || name.ends_with('-') {
        return Some("the VM name ends with '.' or '-'".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUB: &str = "00000000-1111-2222-3333-444444444444";

    fn id(rg: &str, name: &str) -> String {
        format!(
            "/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"
        )
    }

    #[test]
    fn caa_ids_parse() {
        let vm = parse(&id("peerpods-rg", "podvm-nginx-7d9f8c-3a4b5c6d")).expect("valid");
        assert_eq!(vm.subscription, SUB);
        assert_eq!(vm.resource_group, "peerpods-rg");
        assert_eq!(vm.name, "podvm-nginx-7d9f8c-3a4b5c6d");
        assert_eq!(vm.path(), id("peerpods-rg", "podvm-nginx-7d9f8c-3a4b5c6d"));
    }

    #[test]
    fn segment_names_are_case_insensitive() {
        let lower = format!(
            "/SUBSCRIPTIONS/{SUB}/resourcegroups/RG.1(x)/PROVIDERS/microsoft.compute/VIRTUALMACHINES/vm_1.a"
        );
        let vm = parse(&lower).expect("valid");
        assert_eq!(vm.resource_group, "RG.1(x)");
        assert_eq!(vm.name, "vm_1.a");
    }

    #[test]
    fn malformed_ids_say_what_is_wrong() {
        let cases = [
            ("", "empty"),
            ("i-0123456789abcdef0", "must start with '/'"),
            ("/subscriptions/x", "path segments"),
            (&id("rg", "vm")[..id("rg", "vm").len() - 3], "segment"),
            (
                &id("rg", "vm").replace("virtualMachines", "disks"),
                "expected \"virtualMachines\"",
            ),
            (
                &id("rg", "vm").replace("Microsoft.Compute", "Microsoft.Network"),
                "expected \"Microsoft.Compute\"",
            ),
            (&id("rg", "vm").replace(SUB, "my-sub"), "not a GUID"),
            (&id("rg.", "vm"), "ends with '.'"),
            (&id("r g", "vm"), "contains ' '"),
            (&id("", "vm"), "1 to 90"),
            (&id("rg", ""), "1 to 64"),
            (&id("rg", &"a".repeat(65)), "1 to 64"),
            (&id("rg", "vm?api-version=1"), "contains '?'"),
            (&id("rg", "_vm"), "starts with '_'"),
            (&id("rg", "vm-"), "ends with"),
            (&format!("{}/extra", id("rg", "vm")), "path segments"),
        ];
        for (input, expected) in cases {
            let problem = parse(input).expect_err(input);
            assert!(problem.contains(expected), "{input}: {problem}");
        }
    }
}
