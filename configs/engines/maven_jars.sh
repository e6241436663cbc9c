# Sourced by setup_flink.sh and setup_spark.sh (not run on its own): fetches a Maven artifact and its runtime
# dependencies into a folder of jars, through Maven's own cache (~/.m2), with a 5-line pom depending on it.
#
#   maven_jars GROUP:ARTIFACT:VERSION DIR NAME   # jars into DIR/jars; DIR/pom.xml is the pom; NAME names the pom
#
# Needs `mvn` on PATH and the caller's `fail` function (prints the failure and exits).
maven_jars() {
  local coords="$1" dir="$2" name="$3"
  local group="${coords%%:*}" version="${coords##*:}" artifact
  artifact="$(echo "$coords" | cut -d: -f2)"
  mkdir -p "$dir"
  cat > "$dir/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
  <groupId>local.tfrecord-etl</groupId><artifactId>$name</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies><dependency>
    <groupId>$group</groupId>
    <artifactId>$artifact</artifactId>
    <version>$version</version>
  </dependency></dependencies>
</project>
POM
  mvn -B -q -f "$dir/pom.xml" dependency:copy-dependencies -DoutputDirectory="$dir/jars" -DincludeScope=runtime \
    || fail "mvn dependency:copy-dependencies of $coords (pom: $dir/pom.xml)"
  ls "$dir/jars/$artifact-$version.jar" > /dev/null 2>&1 || fail "no $artifact-$version.jar in $dir/jars"
}
