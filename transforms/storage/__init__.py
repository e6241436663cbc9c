"""File and object-store access: local, s3:// and gs:// files (``fileio``), the reader's own object-store client
without Beam (``lightfs``), remote objects read by bounded ranged requests (``remote``), conditional writes and reads against an object's version (``conditional``)."""
