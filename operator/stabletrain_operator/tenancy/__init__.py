"""What a tenant's job may ask of a shared cluster, as the administrator set it: the node
directories, local volume types and Pod Security level a job may use, the checks that refuse
a spec before any pod exists, and the NetworkPolicy every job gets."""
