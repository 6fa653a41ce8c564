//! provider-service backends for IBM Cloud VPC (ibmcloud) and IBM Power Virtual Server (ibmcloud-powervs): work in progress.
